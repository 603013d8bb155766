"""Which cases a command runs: a suite filtered by id glob and by feature, plus cases given as JSON.

Shared by ``attnconf run`` and ``attnconf cases`` (:func:`add_selection_args`, :func:`selection_kwargs`):

* ``--case GLOB`` (repeatable): keep suite cases whose id matches any glob (fnmatch, case-sensitive);
* ``--feature A,B`` (repeatable): keep suite cases having every feature of one of the groups
  (:data:`conformance.cases.case.FEATURES`; ``--feature paged,window --feature softcap`` = paged *and* window,
  *or* softcap);
* ``--exclude GLOB`` / ``--exclude-feature A,B`` (repeatable): then drop the cases a glob / a group matches;
* ``--case-json``: cases of your own, always added (the filters select from the suite);
* ``--shard i/n`` and ``--limit N`` (``run`` only): applied last, in that order.

:class:`Selection` is the frozen value of what decides the (case, backend) pairs of a run: these flags, the
backends, the device and the seed.  ``attnconf run`` parses it once (:meth:`Selection.from_args`), the runner
writes it into the results file's header (``Header.selection``, :meth:`Selection.to_json`), and ``attnconf merge``
rebuilds a shard's cases from it (:meth:`Selection.from_json`, :meth:`Selection.cases`).

Ids name the shape, not every mode: ``gqa_h8_kv2_d128_bf16_b4_ps16nhd_causal_win64-0-1a2b3c`` is
``KIND_hH_kvHK_dD[_dvDV]_DTYPE_BATCH_{contig|psBLOCKLAYOUT}[_causal][_winL-R][_chunkC][_capX][_alibi][_sink]...``
then ``-DIGEST`` (:attr:`conformance.cases.case.AttentionCase.id`); ``'*paged*'`` matches nothing, ``--feature
paged`` selects paged cases.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conformance.cases.case_tables import FEATURES  # torch-free: the parsers list the features in --help
from conformance.exits import UsageError

if TYPE_CHECKING:
    from conformance.cases.case import AttentionCase

__all__ = [
    "CASE_JSON_MAX_BYTES",
    "ID_HELP",
    "SELECTION_SCHEMA",
    "Selection",
    "SelectionError",
    "add_selection_args",
    "case_from_json",
    "json_case_ids",
    "parse_features",
    "parse_models",
    "parse_shard",
    "select_cases",
    "selection_kwargs",
]

ID_HELP = (
    "ids look like gqa_h8_kv2_d128_bf16_b4_ps16nhd_causal_win64-0-1a2b3c (KIND_hH_kvHK_dD_DTYPE_BATCH_"
    "{contig|psBLOCKLAYOUT}[_causal][_winL-R][_capX]...-DIGEST; `attnconf cases --suite S` lists them): "
    "select modes with --feature"
)


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` with 0 <= i < n (0-based, as pytest-shard and CI matrices count)."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard must look like i/n, got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise UsageError(f"--shard i/n needs 0 <= i < n, got {text!r}")
    return i, n


def parse_features(texts: Iterable[str], flag: str = "--feature") -> tuple[tuple[str, ...], ...]:
    """``["paged,window", "softcap"]`` -> ``(("paged", "window"), ("softcap",))``; an unknown name is a usage
    error listing the valid ones."""
    groups = []
    for text in texts:
        names = tuple(sorted({n.strip() for n in text.split(",") if n.strip()}))
        unknown = [n for n in names if n not in FEATURES]
        if not names or unknown:
            raise UsageError(
                f"{flag} {text!r}: unknown feature {', '.join(map(repr, unknown)) or '(empty)'}; "
                f"features are {', '.join(FEATURES)}"
            )
        groups.append(names)
    return tuple(groups)


#: ``--case-json @FILE`` reads at most this many bytes (a few hundred thousand cases): a FIFO or a device such
#: as /dev/zero is refused, not read forever.
CASE_JSON_MAX_BYTES = 64 << 20


def case_from_json(data: Any, where: str = "--case-json") -> AttentionCase:
    """One case from user JSON, strictly (:meth:`AttentionCase.from_json` with ``strict``: an unknown field is
    refused too); the :class:`UsageError` is one line, ``WHERE: PROBLEM; PROBLEM``."""
    from conformance.cases.case import AttentionCase, CaseError

    try:
        return AttentionCase.from_json(data, strict=True)
    except CaseError as exc:
        raise UsageError(f"{where}: {exc.line}") from None


def _read_case_file(text: str) -> str:
    """The text of ``--case-json @FILE``: UTF-8, at most :data:`CASE_JSON_MAX_BYTES`."""
    path = Path(text[1:])
    try:
        with path.open("rb") as fh:
            raw = fh.read(CASE_JSON_MAX_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"--case-json {text}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > CASE_JSON_MAX_BYTES:
        raise UsageError(f"--case-json {text}: larger than {CASE_JSON_MAX_BYTES >> 20} MiB; not a case file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"--case-json {text}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        ) from None


def _json_cases(text: str) -> list[AttentionCase]:
    """``--case-json``: a case (a JSON object) or a list of them, inline or ``@file``; every refusal is one
    :class:`UsageError` line naming the case (``case N``, from 0, in a list), the field and the constraint."""
    raw = _read_case_file(text) if text.startswith("@") else text
    where = "--case-json" + (f" {text}" if text.startswith("@") else "")
    try:
        data = json.loads(raw)
    except RecursionError:
        raise UsageError(
            f"{where}: nested too deeply to be a case (JSON arrays or objects inside each other)"
        ) from None
    except ValueError as exc:  # JSONDecodeError, or an integer of more than 4300 digits
        raise UsageError(f"{where} is not JSON: {exc}") from None
    if not isinstance(data, list):
        return [case_from_json(data, where)]
    if not data:
        raise UsageError(f"{where}: an empty list holds no case")
    return [case_from_json(d, f"{where}: case {i}") for i, d in enumerate(data)]


def parse_models(texts: Iterable[str]) -> tuple[str, ...]:
    """``["llama-3.1-70b,gpt-oss-120b", "deepseek-v3"]`` -> the names, checked against the model registry
    (:mod:`conformance.models`); an unknown name is a usage error listing the valid ones."""
    names = tuple(dict.fromkeys(n.strip() for t in texts for n in t.split(",") if n.strip()))
    if not names:
        return ()
    from conformance.models import builtin_registry

    known = builtin_registry().names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"--model {unknown[0]!r} is not in the model registry; models are {', '.join(known)}")
    return names


def _has_group(case: AttentionCase, groups: tuple[tuple[str, ...], ...]) -> bool:
    feats = case.features()
    return any(feats.issuperset(g) for g in groups)


def _matches(case_id: str, globs: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(case_id, p) for p in globs)


def select_cases(
    suite: str | None,
    patterns: tuple[str, ...] = (),
    case_json: str | None = None,
    shard: tuple[int, int] | None = None,
    limit: int | None = None,
    *,
    exclude: tuple[str, ...] = (),
    features: Iterable[str] = (),
    exclude_features: Iterable[str] = (),
    models: Iterable[str] = (),
) -> list[AttentionCase]:
    """The cases of a run: suite cases matching any ``patterns`` glob (if given) and having every feature of
    one ``features`` group (if given, ``"a,b"`` strings), less those matching an ``exclude`` glob or having
    an ``exclude_features`` group, and (with ``models``) only the cases of those registry models
    (:func:`conformance.models.select_model_cases`; ``--model`` alone means ``--suite models``); plus the JSON
    cases, deduplicated by id; then shard ``i/n`` keeps every n-th from the i-th; then the first ``limit``."""
    keep = parse_features(features)
    model_names = parse_models(models)
    if model_names and suite is None:
        suite = "models"
    drop = parse_features(exclude_features, "--exclude-feature")
    filters = bool(patterns or keep or exclude or drop)
    cases: list[AttentionCase] = []
    if suite is not None:
        from conformance.suites.registry import get_suite, suite_names

        if suite not in suite_names():
            raise UsageError(f"--suite must be one of {suite_names()}, got {suite!r}")
        cases = [
            c
            for c in get_suite(suite)
            if (not patterns or _matches(c.id, patterns))
            and (not keep or _has_group(c, keep))
            and not (exclude and _matches(c.id, exclude))
            and not (drop and _has_group(c, drop))
        ]
        if model_names:
            from conformance.suites.models import select_model_cases

            cases = select_model_cases(cases, model_names)
    elif filters:
        raise UsageError(
            "--case, --exclude, --feature and --exclude-feature filter a suite: give --suite too "
            "(or --case-json for a case of your own)"
        )
    if case_json:
        cases = cases + _json_cases(case_json)
    if suite is None and not case_json:
        raise UsageError("give --suite and/or --case-json")
    cases = list({c.id: c for c in cases}.values())
    if shard is not None:
        cases = cases[shard[0] :: shard[1]]
    if limit is not None:
        if limit < 1:
            raise UsageError(f"--limit must be an integer >= 1, got {limit}")
        cases = cases[:limit]
    if not cases:
        hint = f"; {ID_HELP}" if patterns else ""
        raise UsageError(
            "no case selected (check --case, --exclude, --feature, --exclude-feature, --model, --shard and --limit)"
            + hint
        )
    return cases


def add_selection_args(parser: argparse.ArgumentParser) -> None:
    """``--case``, ``--exclude``, ``--feature``, ``--exclude-feature``, ``--model``: one definition for ``run``
    and ``cases``."""
    parser.add_argument(
        "--case",
        action="append",
        default=[],
        metavar="GLOB",
        help=f"keep suite cases whose id matches this glob (repeatable: any matches); {ID_HELP}",
    )
    parser.add_argument(
        "--feature",
        action="append",
        default=[],
        metavar="F[,F..]",
        help="keep suite cases having every listed feature (repeatable: any group matches); features: "
        + ", ".join(FEATURES),
    )
    parser.add_argument(
        "--exclude", action="append", default=[], metavar="GLOB", help="drop cases whose id matches (repeatable)"
    )
    parser.add_argument(
        "--exclude-feature",
        action="append",
        default=[],
        metavar="F[,F..]",
        help="drop cases having every listed feature (repeatable)",
    )
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME[,NAME..]",
        help="keep the cases of these registry models (repeatable; conformance/models/data; without --suite: "
        "--suite models)",
    )


def selection_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of :func:`select_cases` from parsed selection flags (absent flags: none)."""
    return {
        "exclude": tuple(getattr(args, "exclude", None) or ()),
        "features": tuple(getattr(args, "feature", None) or ()),
        "exclude_features": tuple(getattr(args, "exclude_feature", None) or ()),
        "models": tuple(getattr(args, "model", None) or ()),
    }


def json_case_ids(case_json: str) -> list[str]:
    """The ids of the ``--case-json`` cases (for the header's sweep identity)."""
    return [c.id for c in _json_cases(case_json)]


#: Version of :meth:`Selection.to_json`'s format; a header whose selection has a higher one is not rebuilt here.
SELECTION_SCHEMA = 1


class SelectionError(ValueError):
    """A header's ``selection`` that this version cannot read (not its format, or a newer one); one line naming
    the field."""


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: The JSON fields of :meth:`Selection.to_json` -> (attribute, check of the JSON value, what the check wants).
_FIELDS: dict[str, tuple[str, Any, str]] = {
    "suite": ("suite", lambda v: v is None or isinstance(v, str), "a string or null"),
    "backends": ("backends", _strings, "a list of strings"),
    "case": ("case_patterns", _strings, "a list of strings"),
    "case_json": ("case_json", lambda v: v is None or isinstance(v, str), "a string or null"),
    "exclude": ("exclude", _strings, "a list of strings"),
    "feature": ("features", _strings, "a list of strings"),
    "exclude_feature": ("exclude_features", _strings, "a list of strings"),
    "model": ("models", _strings, "a list of strings"),
    "shard": (
        "shard",
        lambda v: v is None or (isinstance(v, list) and len(v) == 2 and all(map(_count, v)) and 0 <= v[0] < v[1]),
        "null or [i, n] with 0 <= i < n",
    ),
    "limit": ("limit", lambda v: v is None or (_count(v) and v >= 1), "null or an integer >= 1"),
    "device": ("device", lambda v: isinstance(v, str), "a string"),
    "seed": ("seed", lambda v: _count(v) and 0 <= v < 2**32, "an integer in [0, 2**32)"),
}


@dataclass(frozen=True)
class Selection:
    """What decides which (case, backend) pairs a run holds, as ``attnconf run`` was given it: the suite and its
    filters (``--case``, ``--exclude``, ``--feature``, ``--exclude-feature``, ``--model``, as typed), the
    ``--case-json`` cases (inline JSON or ``@FILE``, as typed), ``--shard`` and ``--limit``, the backends (specs,
    as given or defaulted), the device (resolved: never ``auto``) and the seed.

    :meth:`cases` is :func:`select_cases` of it; :meth:`to_json` / :meth:`from_json` are its form in a results
    file's header (``Header.selection``): ``from_json(to_json(s)) == s`` for every selection."""

    backends: tuple[str, ...]
    suite: str | None = None
    case_patterns: tuple[str, ...] = ()
    case_json: str | None = None
    exclude: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    exclude_features: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    shard: tuple[int, int] | None = None
    limit: int | None = None
    device: str = "cpu"
    seed: int = 0

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, device: str, backends: Iterable[str]) -> Selection:
        """The selection of parsed ``attnconf run`` options (:mod:`conformance.running.run_args`), with the
        device and backends as resolved (:func:`conformance.running.usage.device_and_backends`): ``--model``
        without ``--suite`` is ``--suite models``; ``--shard`` is parsed (:func:`parse_shard`)."""
        return cls(
            backends=tuple(backends),
            suite=args.suite or ("models" if args.model else None),
            case_patterns=tuple(args.case),
            case_json=args.case_json,
            exclude=tuple(args.exclude),
            features=tuple(args.feature),
            exclude_features=tuple(args.exclude_feature),
            models=tuple(args.model),
            shard=parse_shard(args.shard) if args.shard else None,
            limit=args.limit,
            device=device,
            seed=args.seed,
        )

    def cases(self) -> list[AttentionCase]:
        """The selected cases, in run order (:func:`select_cases`; its :class:`UsageError` for a bad selection,
        e.g. a suite this checkout does not have or a ``--case-json`` file not here)."""
        return select_cases(
            self.suite,
            self.case_patterns,
            self.case_json,
            self.shard,
            self.limit,
            exclude=self.exclude,
            features=self.features,
            exclude_features=self.exclude_features,
            models=self.models,
        )

    def to_json(self) -> dict[str, Any]:
        """The header's ``selection``: ``{"schema": 1, "suite", "backends", "case", "case_json", "exclude",
        "feature", "exclude_feature", "model", "shard": [i, n] | null, "limit", "device", "seed"}`` (flag
        names; lists for tuples)."""
        out: dict[str, Any] = {"schema": SELECTION_SCHEMA}
        for key, (attr, _, _) in _FIELDS.items():
            value = getattr(self, attr)
            out[key] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_json(cls, data: Any) -> Selection:
        """The selection a header recorded (:meth:`to_json`); :class:`SelectionError` (one line naming the field)
        when it is not an object, its ``schema`` is missing or newer than :data:`SELECTION_SCHEMA`, a field is
        missing, unknown (a newer writer's: the pairs it decides are not known here) or of the wrong type."""
        if not isinstance(data, Mapping):
            raise SelectionError(f"selection must be a JSON object, got {type(data).__name__}")
        schema = data.get("schema")
        if not (isinstance(schema, int) and not isinstance(schema, bool) and 1 <= schema <= SELECTION_SCHEMA):
            raise SelectionError(f"selection.schema must be an integer in [1, {SELECTION_SCHEMA}], got {schema!r}")
        unknown = sorted(set(data) - set(_FIELDS) - {"schema"})
        if unknown:
            raise SelectionError(f"selection.{unknown[0]}: a field this version does not know")
        kwargs: dict[str, Any] = {}
        for key, (attr, ok, wanted) in _FIELDS.items():
            if key not in data:
                raise SelectionError(f"selection.{key} is missing")
            value = data[key]
            if not ok(value):
                raise SelectionError(f"selection.{key} must be {wanted}, got {value!r}")
            kwargs[attr] = tuple(value) if isinstance(value, list) else value
        return cls(**kwargs)
