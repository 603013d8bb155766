"""Seed ``003``'s scenarios: the SGLang forward steps :class:`~conformance.engines.sglang.fa.SGLangFlashAttention`
replays, one ``engines``-suite case each (case ids come from these tables: keep names and fields stable).

A :class:`Scenario` is one forward step of the backend: SGLang's forward mode, the requests, and what an
``AttentionCase`` cannot say (page size of the pool, the draft tree of a top-k verify, MLA, the chunked-prefix
capacity).  :data:`SCENARIOS` are the steps the seed gets right (the ``engines`` suite); :data:`FINDINGS` the steps
where the seed's code diverges from its layer, kept out of the suite and shown by the tests;
:data:`INVARIANCE_SCENARIOS` the invariance checks (:mod:`conformance.engines.invariance`).  A
:class:`GraphScenario` is one CUDA-graph configuration (:data:`GRAPH_SCENARIOS`, replayed by
:mod:`conformance.engines.sglang.graph`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base import Request

__all__ = [
    "FINDINGS",
    "GRAPH_FINDINGS",
    "GRAPH_SCENARIOS",
    "INVARIANCE_SCENARIOS",
    "SCENARIOS",
    "GraphScenario",
    "Scenario",
    "forward_mode",
    "tree_paths",
]

R = Request


@dataclass(frozen=True)
class Scenario:
    """One step of the backend.  ``mode``: SGLang's forward mode (``extend``, ``mixed``, ``decode``,
    ``target_verify``) or ``mla_prefix`` (an MLA extend with chunked prefix cache).  Requests: ``new`` tokens
    (extend length, 1 for decode, the draft tokens for verify), ``cached`` (prefix / context / committed tokens),
    ``encoder`` (cross attention).  ``window`` is ``layer.sliding_window_size`` (already minus one); ``tree`` the
    parent of each draft token (-1 for the root; empty = top-k 1); ``heads`` the layer's ``(num_heads,
    num_kv_heads, head_dim)`` where it is not the default ``(8, 2, 64)`` (MLA's are fixed)."""

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
    heads: tuple[int, int, int] | None = None

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


@dataclass(frozen=True)
class GraphScenario:
    """One CUDA-graph configuration of the backend.  ``mode``: ``decode``, ``target_verify`` or ``draft_decode``;
    ``batches``: the default replay batches as ``ForwardBatch.seq_lens`` (the committed tokens; a decode's
    ``seq_lens`` include its token), the capture bucket first (its size is ``bs``); ``tree``: the top-k > 1
    verify's draft tree (parent per draft token); ``draft_tokens``: ``speculative_num_draft_tokens``; ``topk``,
    ``num_steps``, ``step_id``: the draft model's ``topk``, ``speculative_num_steps``, ``speculative_step_id``;
    ``layer``: ``cross`` (a cross-attention layer over the encoder's tokens) or ``self`` (the self-attention layer
    of the same encoder-decoder step) with ``encoder``: each request's encoder length, batch by batch (empty: no
    encoder, :mod:`conformance.engines.sglang.graph_cross`)."""

    mode: str
    batches: tuple[tuple[int, ...], ...]
    page_size: int = 16
    max_context_len: int = 512
    chunk: int | None = None
    tree: tuple[int, ...] = ()
    draft_tokens: int = 0
    topk: int = 1
    num_steps: int = 0
    step_id: int = 0
    deterministic: bool = False
    layer: str = ""
    encoder: tuple[tuple[int, ...], ...] = ()

    @property
    def q_len(self) -> int:
        """Query rows per request: 1 (decode, top-k 1 draft), ``draft_tokens`` (verify), ``topk`` (draft)."""
        if self.mode == "target_verify":
            return self.draft_tokens
        return self.topk if self.mode == "draft_decode" else 1

    @property
    def new_keys(self) -> int:
        """Keys a request's queries see beyond its ``seq_lens``: verify's draft tokens, the draft steps so far."""
        if self.mode == "target_verify":
            return self.draft_tokens
        if self.mode == "draft_decode":
            return self.topk * (self.step_id + 1)
        return 0

    @property
    def allocated(self) -> int:
        """Tokens allocated per request beyond ``seq_lens`` (draft decode: every step of every branch)."""
        return self.topk * self.num_steps if self.mode == "draft_decode" else self.new_keys


#: decoder ``seq_lens`` of the encoder-decoder graph scenarios (the capture bucket bs = 3 first)
_CROSS_BATCHES = ((70, 9, 30), (5, 50), (17,))

GRAPH_SCENARIOS: dict[str, GraphScenario] = {
    "graph_decode": GraphScenario("decode", ((300, 41, 129, 7), (500, 3, 64), (17, 260), (1,))),
    "graph_decode_deterministic": GraphScenario(
        "decode", ((300, 41, 129, 7), (500, 3, 64), (17, 260), (1,)), deterministic=True
    ),
    # chunk = page size: the capture's one-page virtual batches (seq_lens at the fill value) fit every replay
    "graph_local_decode": GraphScenario("decode", ((69, 31, 32, 40), (100, 33, 64), (45, 90), (37,)), chunk=16),
    "graph_verify_chain": GraphScenario("target_verify", ((30, 57, 100), (140, 9), (64,)), draft_tokens=4),
    "graph_verify_topk": GraphScenario(
        "target_verify",
        ((30, 57, 100), (140, 9), (64,)),
        page_size=1,
        max_context_len=256,
        tree=(-1, 0, 0, 1),
        draft_tokens=4,
        topk=2,
    ),
    "graph_draft_decode": GraphScenario(
        "draft_decode", ((30, 57, 100), (140, 9), (64,)), draft_tokens=4, num_steps=3, step_id=1
    ),
    "graph_draft_decode_topk": GraphScenario(
        "draft_decode",
        ((30, 57, 100), (140, 9), (64,)),
        page_size=1,
        max_context_len=256,
        draft_tokens=4,
        topk=2,
        num_steps=3,
        step_id=1,
    ),
    # encoder-decoder decode (page size 1, as the eager cross scenarios: the encoder table is never strided), every
    # batch's requests sharing one encoder length (the seed writes encoder_lens[:1] to every row); encoder lengths
    # grow then shrink (stale encoder-table columns), decoder lengths vary (stale decoder-table columns)
    "graph_cross_decode": GraphScenario(
        "decode", _CROSS_BATCHES, page_size=1, layer="cross", encoder=((23, 23, 23), (64, 64), (40,))
    ),
    "graph_cross_self_decode": GraphScenario(
        "decode", _CROSS_BATCHES, page_size=1, layer="self", encoder=((23, 23, 23), (64, 64), (40,))
    ),
}

#: Graph configurations where the seed's CUDA-graph path diverges (kept out of ``cases()``; the tests show each).
GRAPH_FINDINGS: dict[str, GraphScenario] = {
    # _update_local_attn_metadata_for_capture sizes the local_block_table view by the capture batch, whose
    # seq_lens are the fill value 1: the chunk adjusted to one page, a view one column wide; replays write
    # chunk // page_size = 2 columns into the buffer behind it.  Refused (ValueError naming local_block_table and the
    # bucket).  Measured on an H100 with the check lifted: vLLM 0.24.0's FA3 reads the table by the buffer's row
    # stride and the replay passes (max error 0.006); a kernel that honours the view's shape sees one page
    "graph_local_decode_wide_chunk": GraphScenario("decode", ((69, 31, 32, 40), (100, 33), (45,)), chunk=32),
    # requests of different encoder lengths in one batch: the replay writes encoder_lens[:1] ("Only support encoder
    # size 1 for now") into every row's encoder_lens_int32 and shifts every decoder table by it, so request 1 on
    # reads request 0's encoder length: the cross layer the wrong number of encoder keys, the self layer its own
    # encoder's keys as decoder keys.  Replayed exactly as the seed does: the numbers fail
    "graph_cross_decode_mixed_encoder": GraphScenario(
        "decode", _CROSS_BATCHES, page_size=1, layer="cross", encoder=((23, 64, 40), (64, 23), (40,))
    ),
    "graph_cross_self_decode_mixed_encoder": GraphScenario(
        "decode", _CROSS_BATCHES, page_size=1, layer="self", encoder=((23, 64, 40), (64, 23), (40,))
    ),
}


_INV_DECODE = (R(1, 299), R(1, 44), R(1, 130), R(1, 7))
_INV_EXTEND = (R(20, 64), R(7), R(33, 17), R(12, 90))
_INV_VERIFY = (R(4, 30), R(4, 57), R(4, 9))


def forward_mode(requests: tuple[Request, ...]) -> str:
    """The ``ForwardMode`` SGLang's scheduler runs a batch of these requests in: ``decode`` when every request is one
    new token after cached ones, ``extend`` when none is, else ``mixed`` (mixed chunked prefill,
    ``--enable-mixed-chunk``: the running decodes join the prefill chunk's extend batch)."""
    decodes = [r.new == 1 and r.cached > 0 for r in requests]
    return "decode" if all(decodes) else "extend" if not any(decodes) else "mixed"


#: the growing-neighbour steps: request 0 (a decode, or a 5-token extend, of 3,000 keys: long enough for a split
#: heuristic to split) beside a 129-token extend after 971 cached tokens, which the ``neighbour`` invariance cuts to
#: 1 (a decode), 9, 10, 64, 65 and 128 new tokens; each variant runs in its own :func:`forward_mode` (a decode
#: target beside a prefill is one MIXED extend call: vLLM #51902's shape, a decode row in the prefill's call).
_NB_DECODE = (R(1, 2999), R(129, 971))
_NB_CHUNK = (R(5, 2995), R(129, 971))
#: ``(num_heads, num_kv_heads, head_dim)`` at the two head dims FA kernels compile templates for, both GQA 7 (as
#: vLLM #51902's 14 / 2 heads): Qwen2.5-0.5B's (d64) and Qwen2.5-7B's (d128).
_NB_HEADS = {64: (14, 2, 64), 128: (28, 4, 128)}


def _neighbour_scenarios() -> dict[str, tuple[str, Scenario]]:
    """``inv_neighbour_{decode,chunk}_d{64,128}`` in the default configuration, then with deterministic inference."""
    out = {}
    for mode, det in (("", False), ("deterministic_", True)):
        for d, heads in _NB_HEADS.items():
            for target, reqs in (("decode", _NB_DECODE), ("chunk", _NB_CHUNK)):
                sc = Scenario(forward_mode(reqs), reqs, page_size=16, deterministic=det, heads=heads)
                out[f"inv_neighbour_{mode}{target}_d{d}"] = ("neighbour", sc)
    return out


#: name -> (invariance kind, step): request 0's rows through the whole step, compared bitwise
#: (:mod:`conformance.engines.invariance`); the batch is the case's ``requests`` (each variant a step of its own;
#: a ``neighbour`` variant in its own :func:`forward_mode`).  With ``deterministic`` (deterministic inference:
#: ``num_splits = 1``) a ``batch`` or ``neighbour`` difference fails on a kernel that takes a split count; without,
#: it is reported.
INVARIANCE_SCENARIOS: dict[str, tuple[str, Scenario]] = {
    "inv_run_decode": ("run", Scenario("decode", _INV_DECODE, page_size=16)),
    "inv_batch_decode": ("batch", Scenario("decode", _INV_DECODE, page_size=16)),
    "inv_batch_extend": ("batch", Scenario("extend", _INV_EXTEND, page_size=16)),
    "inv_batch_decode_deterministic": ("batch", Scenario("decode", _INV_DECODE, page_size=16, deterministic=True)),
    "inv_batch_extend_deterministic": ("batch", Scenario("extend", _INV_EXTEND, page_size=16, deterministic=True)),
    "inv_batch_verify_deterministic": (
        "batch",
        Scenario("target_verify", _INV_VERIFY, page_size=16, deterministic=True),
    ),
    "inv_run_extend_deterministic": ("run", Scenario("extend", _INV_EXTEND, page_size=16, deterministic=True)),
    **_neighbour_scenarios(),
}
