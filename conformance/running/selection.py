"""Which cases a command runs: a suite filtered by id glob and by feature, plus cases given as JSON.

Shared by ``attnconf run`` and ``attnconf cases`` (:func:`add_selection_args`, :func:`selection_kwargs`):

* ``--case GLOB`` (repeatable): keep suite cases whose id matches any glob (fnmatch, case-sensitive);
* ``--feature A,B`` (repeatable): keep suite cases having every feature of one of the groups
  (:data:`conformance.cases.case.FEATURES`; ``--feature paged,window --feature softcap`` = paged *and* window,
  *or* softcap);
* ``--exclude GLOB`` / ``--exclude-feature A,B`` (repeatable): then drop the cases a glob / a group matches;
* ``--case-json``: cases of your own, always added (the filters select from the suite);
* ``--shard i/n`` and ``--limit N`` (``run`` only): applied last, in that order.

Ids name the shape, not every mode: ``gqa_h8_kv2_d128_bf16_b4_ps16nhd_causal_win64-0-1a2b3c`` is
``KIND_hH_kvHK_dD[_dvDV]_DTYPE_BATCH_{contig|psBLOCKLAYOUT}[_causal][_winL-R][_chunkC][_capX][_alibi][_sink]...``
then ``-DIGEST`` (:attr:`conformance.cases.case.AttentionCase.id`); ``'*paged*'`` matches nothing, ``--feature
paged`` selects paged cases.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conformance.cases.case_tables import FEATURES  # torch-free: the parsers list the features in --help
from conformance.exits import UsageError

if TYPE_CHECKING:
    from conformance.cases.case import AttentionCase

__all__ = [
    "CASE_JSON_MAX_BYTES",
    "ID_HELP",
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
