"""Invariance verdicts: the promises of deterministic serving, compared bit for bit.

An invariance case (``AttentionCase.invariance``) runs several calls whose outputs for one request must be the
same bits if the kernel keeps the promise:

* ``run``: the same call twice (run-to-run determinism; promised by every forward kernel here);
* ``batch``: request 0 alone, inside its batch, at the batch's last position, and beside the other requests cut
  to half their keys (batch invariance: vLLM's batch-invariant mode and SGLang's deterministic inference promise
  it with ``num_splits = 1``, so a case with ``num_splits == 1`` makes a difference a failure on a backend whose
  every call takes the split count, :meth:`~attnfast.base.Backend.pins_splits` from the adapter's declared
  ``batch_invariance_via``; on a kernel without that argument (SDPA, flex, torch-flash, FlashMLA) it is
  reported, not failed);
* ``neighbour``: request 0 beside its neighbour (request 1), alone, and beside the neighbour cut to 1, 9, 10, 64,
  65, 128 and 129 query tokens (those below its own; each cut keeps the neighbour's first queries and as many fewer
  keys, a shorter prompt of the same tokens): the neighbour grows by one token and by one tile, and turns from
  decode to prefill, which is where a kernel that picks its tiles, GQA packing or scheduler from the batch's
  longest request breaks batch invariance (vLLM issue #51902: an FA3 decode row changed when an unrelated
  prefill grew from 9 to 10 tokens at ``num_splits = 1``).  Promised as ``batch`` is;
* ``splits``: ``num_splits`` 1, 2 and 3 and the kernel's own heuristic (never promised: the report shows which
  split counts change the bits).

Every call of the composition is also judged numerically: the composition's output is the calls' outputs one
after the other, and its reference the references of the same calls (:meth:`InvarianceRun.reference`), so a
variant that is wrong, not just different, fails like any case.  The bitwise comparisons go to the record's
``extra["invariance"]`` (the report's invariance matrix), and to its failure reason when promised.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from attnfast.base import Backend, KernelOutput, Support
from attnref import AttnResult
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

from .assemble import assemble, assemble_refusal
from .bitwise import diff_rows
from .composed import ComposedRun

__all__ = ["INVARIANCE", "Invariance", "InvarianceRun", "Variant", "variants"]

#: pinned split counts the ``splits`` invariance tries beside 1 and the heuristic.
PINNED_SPLITS = (2, 3)
#: query counts the ``neighbour`` invariance cuts the neighbour to (those below its own): decode, then one token
#: across 9 -> 10 (vLLM #51902) and one across each tile edge of 64 and 128 query rows.
NEIGHBOUR_QUERIES = (1, 9, 10, 64, 65, 128, 129)


@dataclass(frozen=True)
class Variant:
    """One call of an invariance: its label, case, and where request 0's rows sit in its output."""

    label: str
    case: AttentionCase
    #: (request index, kv_len[, q_len]) per request of the call (:func:`conformance.graphs.assemble.assemble`)
    picks: tuple[tuple[int, ...], ...]
    target_row: int

    @property
    def target_rows(self) -> slice:
        q0 = self.target_row
        return slice(q0, q0 + self.case.q_lens[self.target_index])

    @property
    def target_index(self) -> int:
        return [p[0] for p in self.picks].index(0)


def variants(case: AttentionCase) -> list[Variant]:
    """The calls an invariance case makes, the first being the case's own call (without the invariance field)."""
    own = tuple((r, kv) for r, (_, kv) in enumerate(case.requests))
    plain = case.replace(invariance="")

    def make(label: str, picks: tuple[tuple[int, ...], ...], **changes: Any) -> Variant:
        reqs = tuple((p[2] if len(p) > 2 else case.requests[p[0]][0], p[1]) for p in picks)
        call = plain.replace(requests=reqs, **changes)
        row = sum(call.q_lens[: [p[0] for p in picks].index(0)])
        return Variant(label, call, picks, row)

    if case.invariance == "run":
        return [make("first run", own), make("second run", own)]
    if case.invariance == "batch":
        others = own[1:]
        # half the keys; a causal request keeps at least its q_len of them (never more than it has: sq > sk)
        cut = tuple((r, min(kv, max(case.requests[r][0] if case.causal else 0, kv // 2))) for r, kv in others)
        return [
            make("in batch (first)", own),
            make("alone", own[:1]),
            make("in batch (last)", others + own[:1]),
            make("beside shorter requests", own[:1] + cut),
        ]
    if case.invariance == "neighbour":
        (nq, nkv) = case.requests[1]
        cuts = [q for q in NEIGHBOUR_QUERIES if q < nq]
        return [
            make(f"beside a neighbour of {_queries(nq)}", own),
            make("alone", own[:1]),
            *(make(f"beside a neighbour of {_queries(q)}", (own[0], (1, max(0, nkv - (nq - q)), q))) for q in cuts),
        ]
    if case.invariance == "splits":
        out = [make("heuristic (num_splits None)", own), make("num_splits 1", own, num_splits=1)]
        return out + [make(f"num_splits {n}", own, num_splits=n) for n in PINNED_SPLITS]
    raise ValueError(f"invariance must be one of run, batch, neighbour, splits; got {case.invariance!r}")


def _queries(n: int) -> str:
    return "1 query" if n == 1 else f"{n} queries"


def _promised(case: AttentionCase, backend: Backend) -> bool:
    """``run``: always; ``batch`` and ``neighbour``: ``num_splits == 1`` and every variant's call takes it (the
    adapter's declaration, :meth:`~attnfast.base.Backend.pins_splits`); ``splits``: never."""
    if case.invariance == "run":
        return True
    if case.invariance not in ("batch", "neighbour") or case.num_splits != 1:
        return False
    return all(backend.pins_splits(v.case) for v in variants(case))


class InvarianceRun(ComposedRun):
    """The callable :meth:`Invariance.prepare` returns: every variant's call, then the bitwise comparisons.

    :meth:`call` (one variant's call) and :meth:`promised` are the hooks an engine-level invariance overrides
    (:mod:`conformance.engines.invariance`)."""

    def call(self, v: Variant, call: AttentionCase, inputs: CaseInputs) -> KernelOutput:
        """Run one variant's call on the backend (``call``/``inputs``: the variant's batch, assembled)."""
        call = dataclasses.replace(call, num_splits=v.case.num_splits)
        inputs = dataclasses.replace(inputs, case=call)
        fn = self.backend.prepare(call, inputs)
        out = fn()
        self.notes.append(f"{v.label}: {call.summary()} (num_splits {call.num_splits})")
        return out

    def promised(self) -> bool:
        """Whether a difference fails the case (else it is reported in ``extra["invariance"]`` only)."""
        return _promised(self.case, self.backend)

    def run(self) -> KernelOutput:
        results, built = [], {}
        for v in variants(self.case):
            if v.picks not in built:  # one set of buffers per batch: the same call twice reads the same memory
                built[v.picks] = assemble(self.case, self.inputs, v.picks)
            call, inputs = built[v.picks]
            results.append((v, self.call(v, call, inputs)))
        base_v, base = results[0]
        pairs, promised = [], self.promised()
        first = _target(base_v, base)
        for v, res in results[1:]:
            d = diff_rows(first, _target(v, res))
            pairs.append({"a": base_v.label, "b": v.label, **d.to_json()})
            if promised and not d.equal:
                self.problems.append(
                    f"invariance {self.case.invariance}: request 0 '{v.label}' differs from '{base_v.label}': "
                    f"{d.describe()}"
                )
        self.extra["invariance"] = {
            "kind": self.case.invariance,
            "kept": all(p["equal"] for p in pairs),
            "promised": promised,
            "pairs": pairs,
        }
        outs = [r.out for _, r in results]
        lses = [r.lse for _, r in results]
        present = [x for x in lses if x is not None]
        lse = torch.cat(present, dim=1) if len(present) == len(lses) else None
        return KernelOutput(torch.cat(outs), lse)


def _target(v: Variant, res: KernelOutput) -> KernelOutput:
    rows = v.target_rows
    return KernelOutput(res.out[rows], None if res.lse is None else res.lse[:, rows])


class Invariance:
    """The composition that judges an invariance case (``conformance.verdict.check.composition_of``)."""

    name = "invariance"

    def refuses(self, case: AttentionCase) -> str:
        """What no backend can run as variants (:func:`~conformance.graphs.assemble.assemble_refusal`)."""
        return assemble_refusal(case)

    def supports(self, case: AttentionCase, backend: Backend, device: str) -> Support:
        for v in variants(case):
            support = backend.supports(v.case, device)
            if not support:
                return Support(False, f"{v.label}: {support.reason}")
        return Support(True)

    def prepare(self, case: AttentionCase, inputs: CaseInputs, backend: Backend, device: str) -> InvarianceRun:
        # no mutate: ComposedRun keeps the device for its readers; the invariance run reads none of it (its calls
        # run on the inputs' device), so no test can tell device from None
        return InvarianceRun(case, inputs, backend, device)  # pragma: no mutate

    def _each(self, case: AttentionCase, inputs: CaseInputs, fn: Any) -> list[Any]:
        out = []
        for v in variants(case):
            call, built = assemble(case, inputs, v.picks)
            # no mutate: the reference and the baseline read neither the split count nor inputs.case (the variant's
            # call is handed to them whole all the same)
            call = dataclasses.replace(call, num_splits=v.case.num_splits)  # pragma: no mutate
            built = dataclasses.replace(built, case=call)  # pragma: no mutate
            out.append(fn(call, built))
        return out

    def reference(self, case: AttentionCase, inputs: CaseInputs) -> AttnResult:
        from conformance.verdict.reference import reference

        parts = self._each(case, inputs, reference)
        return AttnResult(torch.cat([p.out for p in parts]), torch.cat([p.lse for p in parts], dim=1))

    def baseline(self, case: AttentionCase, inputs: CaseInputs) -> tuple[torch.Tensor, torch.Tensor]:
        from conformance.verdict.baseline import baseline

        parts = self._each(case, inputs, baseline)
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts], dim=1)


INVARIANCE = Invariance()
