"""Seed ``003``'s scenarios: the SGLang forward steps :class:`~conformance.engines.sglang.fa.SGLangFlashAttention`
replays, one ``engines``-suite case each (case ids come from these tables: keep names and fields stable).

A :class:`Scenario` is one forward step of the backend: SGLang's forward mode, the requests, and what an
``AttentionCase`` cannot say (page size of the pool, the draft tree of a top-k verify, MLA, the chunked-prefix
capacity).  :data:`SCENARIOS` are the steps the seed gets right (the ``engines`` suite); :data:`FINDINGS` the steps
where the seed's code diverges from its layer, kept out of the suite and shown by the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base import Request

__all__ = ["FINDINGS", "SCENARIOS", "Scenario", "tree_paths"]

R = Request


@dataclass(frozen=True)
class Scenario:
    """One step of the backend.  ``mode``: SGLang's forward mode (``extend``, ``mixed``, ``decode``,
    ``target_verify``) or ``mla_prefix`` (an MLA extend with chunked prefix cache).  Requests: ``new`` tokens
    (extend length, 1 for decode, the draft tokens for verify), ``cached`` (prefix / context / committed tokens),
    ``encoder`` (cross attention).  ``window`` is ``layer.sliding_window_size`` (already minus one); ``tree`` the
    parent of each draft token (-1 for the root; empty = top-k 1)."""

    mode: str
    requests: tuple[Request, ...]
    page_size: int = 1
    chunk: int | None = None
    window: int | None = None
    tree: tuple[int, ...] = ()
    mla: bool = False
    fp8: bool = False
    sinks: bool = False
    softcap: float | None = None
    deterministic: bool = False
    chunk_capacity: int = 0

    @property
    def cross(self) -> bool:
        return any(r.encoder for r in self.requests)


SCENARIOS: dict[str, Scenario] = {
    "prefill": Scenario("extend", (R(37), R(64), R(5)), page_size=16),
    "extend_prefix": Scenario("extend", (R(20, 64), R(7), R(33, 17)), page_size=16),
    "decode": Scenario("decode", (R(1, 69), R(1, 0), R(1, 128)), page_size=16),
    "mixed": Scenario("mixed", (R(1, 39), R(25, 65), R(1, 16), R(12)), page_size=16),
    "decode_deterministic": Scenario("decode", (R(1, 299), R(1, 44)), page_size=16, deterministic=True),
    "local_extend": Scenario("extend", (R(40, 60), R(10, 15), R(70)), chunk=32),
    "local_decode": Scenario("decode", (R(1, 69), R(1, 31), R(1, 32), R(1, 4)), chunk=32),
    "sliding_window_extend": Scenario("extend", (R(30, 60), R(16), R(5, 55)), page_size=16, window=23, sinks=True),
    "sliding_window_decode": Scenario("decode", (R(1, 79), R(1, 9), R(1, 24)), page_size=16, window=23, softcap=30.0),
    "spec_verify_chain": Scenario("target_verify", (R(4, 30), R(4, 57)), page_size=16),
    "spec_verify_topk": Scenario("target_verify", (R(4, 30), R(4, 57)), tree=(-1, 0, 0, 1)),
    "spec_verify_topk_swa": Scenario("target_verify", (R(4, 30), R(4, 57)), tree=(-1, 0, 0, 1), window=23),
    "cross_extend": Scenario("extend", (R(12, 0, 40),)),
    "cross_decode": Scenario("decode", (R(1, 9, 40),)),
    "mla_decode": Scenario("decode", (R(1, 99), R(1, 63), R(1, 4)), page_size=64, mla=True),
    "mla_extend": Scenario("extend", (R(8, 90), R(3)), page_size=64, mla=True),
    "mla_chunked_prefix": Scenario("mla_prefix", (R(16, 300), R(33, 70), R(8)), mla=True, chunk_capacity=192),
    "fp8_kv_decode": Scenario("decode", (R(1, 59), R(1, 32), R(1, 99)), page_size=16, fp8=True),
    "fp8_kv_extend": Scenario("extend", (R(20, 44), R(9)), page_size=16, fp8=True),
}

#: Scenarios where the seed's code diverges from its layer (kept out of ``cases()``; the tests show each).
FINDINGS: dict[str, Scenario] = {
    # virtual batches cut from the token-granular table: token slots used as page ids (sglang PR 32902)
    "local_paged": Scenario("extend", (R(40, 60), R(10, 15), R(70)), page_size=16, chunk=32),
    # with the table fixed: the chunk adjusted to min(64, 50) // 16 * 16 = 48 splits the 50-token prefill at 48
    "local_short_batch": Scenario("extend", (R(50), R(20, 10)), page_size=16, chunk=64),
    # MIXED builds no local metadata: the chunked layer attends the whole context
    "local_mixed": Scenario("mixed", (R(1, 69), R(40, 60)), chunk=32),
    # sinks passed to the prefix and the expand call: counted twice by the merge
    "spec_verify_topk_sinks": Scenario("target_verify", (R(4, 30), R(4, 57)), tree=(-1, 0, 0, 1), sinks=True),
    # the encoder page table is never strided to pages: token slots used as page ids
    "cross_paged": Scenario("extend", (R(12, 0, 40),), page_size=16),
    # (batch_size, hk) descales for a call of more (virtual) sequences: FA3's CHECK_SHAPE refuses them
    "fp8_local": Scenario("extend", (R(40, 60), R(10, 15)), chunk=32, fp8=True),
}


def tree_paths(tree: tuple[int, ...]) -> list[list[int]]:
    """Draft tokens each token sees: itself and its ancestors, in index order."""
    out = []
    for i in range(len(tree)):
        path, node = [], i
        while node >= 0:
            path.append(node)
            node = tree[node]
        out.append(sorted(path))
    return out
