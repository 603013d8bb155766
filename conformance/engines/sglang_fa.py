"""Seed ``003``: SGLang's FlashAttention backend (``flashattention_backend.py``, 2025-09-22), replayed end to end.

The replay follows the seed's ``init_forward_metadata`` (eager path, not the CUDA-graph capture/replay copies),
``forward_extend`` and ``forward_decode``, written here from the seed (no copied code), on an SGLang-style memory
pool: ``req_to_token`` (request x position -> token slot ``page * page_size + offset``, pages handed out in a
shuffled order, one spare) and one layer's K/V buffer ``(num_pages, page_size, hk, d)`` (``view(-1, page_size,
...)``), unused slots stale.  Every kernel call is ``flash_attn_with_kvcache`` without new keys (the cache is written
first, ``set_kv_buffer``), i.e. a paged call with ``cache_seqlens`` keys, or ``flash_attn_varlen_func`` for MLA's
chunked prefix; each runs on the adapter under test.  What it checks, per scenario (:data:`SCENARIOS`):

* the metadata builder: ``cache_seqlens_int32``, ``cu_seqlens_q`` (``cu_seqlens_k`` itself for a prefill without
  prefix, the extend lengths' prefix sums otherwise), ``cu_seqlens_k`` (passed as ``cu_seqlens_k_new``), and the
  page table ``req_to_token[:, :max_seq_len_k]`` strided to pages (``[:, ::page_size] // page_size``); modes
  EXTEND, MIXED (decodes and prefill chunks in one extend call), DECODE, TARGET_VERIFY;
* chunked local attention through virtual batches (:mod:`conformance.engines.sglang_local`; causal, no
  ``cu_seqlens_k_new``); the layer's reference is attention with the case's ``chunk``;
* sliding windows: the layer value is already the model's window minus one and goes to the kernel as ``(w, 0)``
  (:meth:`SGLangFlashAttention.window_size`); sinks and soft-cap are forwarded to every call;
* speculative verify: top-k 1 is one causal call over ``seq_lens + draft``; top-k > 1 is a cascade: a prefix call
  over the committed cache (``causal=False``) and an *expand* call where every draft token is its own sequence
  over the draft-tree tokens it may see, its row of the expand page table built from the custom mask as the seed
  does (draft columns ``seq_len + i``, visible ones sorted first, ``cache_seqlens = mask.sum(1)``; the table holds
  token slots, so page size 1), merged with ``merge_state_v2`` (LSE transposed to ``(n, h)``).  With a sliding
  window there is no cascade: each draft token gets ``prefix + visible draft`` in one row (``swa_spec_metadata``).
  The layer's reference is the tree: each draft token over the prefix and its ancestors;
* cross attention: the encoder page table ``req_to_token[:, :encoder_len]`` with ``encoder_lens_int32`` (one
  encoder sequence, as SGLang supports), no causal mask, no window;
* MLA absorbed (DeepSeek, ``qv``): one 576-wide cache ``[c_kv | k_rope]`` split into views
  (:meth:`SGLangFlashAttention.split_mla_cache`), ``q = q_rope`` against the ``k_rope`` view, ``qv = q_nope``
  against the ``c_kv`` view, which is also V; the call's ``mla_cache`` is rebuilt from the two views, so a wrong
  split reaches kernels that read the joint cache (FlashMLA, vLLM's FA3 views) as well;
* MLA chunked prefix (``attn_attend_prefix_cache``): the new tokens causal with LSE, each prefix chunk non-causal
  with LSE, merged into the running result by ``merge_state_v2`` (the model's loop in ``deepseek_v2.py``, not in
  the seed); chunk ``i`` of a request covers its prefix ``[i L, min((i + 1) L, prefix))``, ``L = capacity //
  batch`` (``ForwardBatch.prepare_chunked_prefix_cache_info``, also outside the seed).  A request without prefix
  gets empty chunks (LSE ``-inf``), merged into a finite running result, so no NaN (unlike seed 004's order);
* fp8 KV cache: ``k_descale``/``v_descale`` are the per-tensor scales expanded to ``(batch_size, hk)``
  (:meth:`SGLangFlashAttention.descales`), ``batch_size`` being the forward batch's; the calls are therefore
  per-(sequence, kv head) descale calls (``descale="head"``) that must carry exactly that shape.  SGLang casts q
  to fp8 with ``q.to(fp8)`` and passes no ``q_descale``, i.e. descale 1; the replay gives the kernel the case's
  stored fp8 q with its own descale (``quant_q=True``): an exact replay of the raw cast would judge the kernel on
  a q rounded differently from the one the reference reads;
* ``num_splits = 1`` for deterministic inference (the case's ``num_splits``), else 0 (the heuristic).

Every paged call's metadata is checked first (:func:`~conformance.engines.sglang_local.check_call_metadata`,
``ValueError`` naming the field).  The forward returns the layer output and the LSE the kernel (or the merge)
computed; SGLang asks for the LSE only where it merges, the replay checks it everywhere.

Findings (:data:`FINDINGS`, scenarios kept out of :meth:`~SGLangFlashAttention.cases`, see the tests): with
``page_size > 1`` the eager path builds the virtual batches from the token-granular ``req_to_token`` slice before
it is strided to pages (the local table then holds token slots), and the chunk adjustment cuts short batches at
page multiples (both fixed upstream by sglang PR 32902, reported as an illegal memory access at page size 16);
MIXED steps build no local metadata, so chunked-local layers attend the whole context; top-k > 1 verify passes
``sinks`` to both cascade calls (the sink counted twice by the merge); the encoder page table is never strided to
pages; fp8 descales are ``(batch_size, hk)`` where virtual batches have more sequences (FA3: ``CHECK_SHAPE(k_descale,
batch_size, num_heads_k)``).  Not modelled: CUDA-graph metadata copies, draft decode and draft extend, hybrid SWA
pools (``full_to_swa_index_mapping``), FA4 (``fa_impl_ver``), fp8 with MLA (head dim 576 > 256: no descales, the
fp8 cache cast to q's dtype without a scale).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnfast.base import KernelOutput
from attnref import AttnResult, expand_descale, gather_kv, write_kv_cache
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs, QuantTensors
from conformance.cases.sweep import MLA_SCALE

from .base import Call, Engine, Kernel, Request, call_inputs
from .calls import STALE, call_case, contiguous_call
from .merge import merge_attn_states
from .sglang_local import VirtualBatches, check_call_metadata, make_local_attention_virtual_batches, prefix_sums

__all__ = ["FINDINGS", "SCENARIOS", "SGLangFlashAttention", "Scenario", "SGLMetadata"]

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


@dataclass
class SGLMetadata:
    """SGLang's ``FlashAttentionMetadata`` (the fields the replay uses); ``expand`` is the backend's
    ``forward_metadata_spec_decode_expand``; ``local_attn_metadata`` the virtual batches."""

    cache_seqlens_int32: list[int]
    cu_seqlens_q: list[int]
    cu_seqlens_k: list[int] | None
    page_table: torch.Tensor
    max_seq_len_q: int = 1
    max_seq_len_k: int = 0
    encoder_lens_int32: list[int] | None = None
    encoder_cu_seqlens_k: list[int] | None = None
    encoder_page_table: torch.Tensor | None = None
    local_attn_metadata: VirtualBatches | None = None
    swa_spec_metadata: SGLMetadata | None = None
    expand: SGLMetadata | None = None


@dataclass
class _Step:
    """One forward step: the pool, the ForwardBatch fields the builder reads, the metadata, the calls."""

    scenario: Scenario
    page_size: int
    num_pages: int
    req_to_token: torch.Tensor
    seq_lens: list[int]
    custom_mask: torch.Tensor | None
    metadata: SGLMetadata | None = None
    calls: list[_KCall] = field(default_factory=list)
    combine: str = "single"


@dataclass
class _KCall:
    """One kernel call: its case, the metadata it reads (paged) or the key spans per request (varlen)."""

    label: str
    case: AttentionCase
    names: tuple[str, str, str, str | None] = ("", "", "", None)
    table: torch.Tensor | None = None
    lens: list[int] | None = None
    cu_q: list[int] = field(default_factory=list)
    cu_k: list[int] | None = None
    spans: list[tuple[int, int]] | None = None


_MAIN = ("page_table", "cache_seqlens_int32", "cu_seqlens_q", "cu_seqlens_k")
_ENCODER = ("encoder_page_table", "encoder_lens_int32", "cu_seqlens_q", "encoder_cu_seqlens_k")
_LOCAL = ("local_block_table", "local_seqused_k", "local_query_start_loc", None)
#: Case fields a scenario fixes (heads, head dims without qv, dtype and scale may vary).
_SCENARIO_FIELDS = (
    "requests",
    "kv_layout",
    "block_size",
    "causal",
    "window",
    "chunk",
    "qv",
    "head_dim",
    "head_dim_v",
    "quant",
    "descale",
    "sinks",
    "softcap",
    "num_splits",
    "append",
    "alibi",
    "v_padded",
)


def _prefixed(prefix: str) -> tuple[str, str, str, str]:
    return tuple(prefix + n for n in _MAIN)  # type: ignore[return-value]


def _tree_paths(tree: tuple[int, ...]) -> list[list[int]]:
    """Draft tokens each token sees: itself and its ancestors, in index order."""
    out = []
    for i in range(len(tree)):
        path, node = [], i
        while node >= 0:
            path.append(node)
            node = tree[node]
        out.append(sorted(path))
    return out


class SGLangFlashAttention(Engine):
    """Seed 003 replayed: SGLang's FlashAttention backend (see the module docstring)."""

    name = "sglang_fa"
    seed = "003"
    description = (
        "SGLang FlashAttention backend: page table, virtual batches, windows, top-k verify cascade, cross, MLA, fp8"
    )

    # ------------------------------------------------------------------ scenarios as cases
    def _case(self, name: str, sc: Scenario) -> AttentionCase:
        reqs = tuple((r.new, r.encoder if sc.cross else r.kv) for r in sc.requests)
        layer: dict = dict(num_heads=8, num_kv_heads=2, head_dim=64)
        if sc.mla and sc.mode == "mla_prefix":
            layer = dict(num_heads=8, num_kv_heads=8, head_dim=192, head_dim_v=128, scale=MLA_SCALE)
        elif sc.mla:
            layer = dict(num_heads=16, num_kv_heads=1, head_dim=64, head_dim_v=512, qv=True, scale=MLA_SCALE)
        paged = sc.mode != "mla_prefix"
        return AttentionCase(
            requests=reqs,
            **layer,
            dtype="bf16",
            kv_layout="NHD" if paged else "contiguous",
            block_size=sc.page_size if paged else None,
            causal=not sc.cross,
            window=(sc.window, 0) if sc.window is not None else (None, None),
            chunk=sc.chunk,
            softcap=sc.softcap,
            sinks=sc.sinks,
            num_splits=1 if sc.deterministic else None,
            quant="fp8_e4m3" if sc.fp8 else "none",
            engine=self.name,
            scenario=name,
        )

    def cases(self) -> list[AttentionCase]:
        return [self._case(name, sc) for name, sc in SCENARIOS.items()]

    def scenario(self, case: AttentionCase) -> Scenario:
        sc = SCENARIOS.get(case.scenario) or FINDINGS.get(case.scenario)
        if sc is None:
            known = sorted(SCENARIOS) + sorted(FINDINGS)
            raise ValueError(f"scenario must be one of {known} for engine {self.name}, got {case.scenario!r}")
        return sc

    def check(self, case: AttentionCase) -> None:
        canon = self._case(case.scenario, self.scenario(case))
        for f in _SCENARIO_FIELDS:
            if getattr(case, f) != getattr(canon, f):
                raise ValueError(
                    f"{f} must be {getattr(canon, f)!r} for scenario {case.scenario!r}, got {getattr(case, f)!r}"
                )

    # ------------------------------------------------------------------ the layer's hooks (planted bugs override)
    def window_size(self, sliding_window_size: int | None) -> tuple[int, int]:
        """``(layer.sliding_window_size, 0)``: the model already subtracted one; ``(-1, -1)`` without a window."""
        return (sliding_window_size, 0) if sliding_window_size is not None and sliding_window_size > -1 else (-1, -1)

    def split_mla_cache(self, kv_cache: torch.Tensor, v_head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k_rope, c_kv)`` views of the 576-wide ``[c_kv | k_rope]`` cache."""
        return kv_cache[..., v_head_dim:], kv_cache[..., :v_head_dim]

    def descales(self, scale: torch.Tensor, batch_size: int, num_kv_heads: int) -> torch.Tensor:
        """``layer.k_scale.expand((batch_size, tp_k_head_num))``."""
        return scale.reshape(1, 1).expand(batch_size, num_kv_heads)

    def merge_state(self, o_a, s_a, o_b, s_b) -> tuple[torch.Tensor, torch.Tensor]:
        """``merge_state_v2`` (LSE ``(n, h)``): vLLM's ``merge_attn_states`` with the LSE transposed."""
        out, lse = merge_attn_states(o_a, s_a.transpose(0, 1), o_b, s_b.transpose(0, 1))
        return out, lse.transpose(0, 1)

    def local_page_table(self, page_table: torch.Tensor, page_size: int) -> torch.Tensor:
        """The table ``_init_local_attn_metadata`` reads: the metadata's page table *before* it is strided to pages
        (token slots when ``page_size > 1``; see the findings)."""
        return page_table

    def virtual_batches(self, chunk: int, cu_q: list[int], lens: list[int], table: torch.Tensor, page_size: int):
        return make_local_attention_virtual_batches(chunk, cu_q, lens, table, page_size)

    # ------------------------------------------------------------------ pool and ForwardBatch
    def _step(self, case: AttentionCase) -> _Step:
        self.check(case)
        sc = self.scenario(case)
        if sc.mode == "target_verify":
            drafts = {r.new for r in sc.requests} | ({len(sc.tree)} if sc.tree else set())
            if len(drafts) != 1:
                raise ValueError(
                    f"requests: every verify request has speculative_num_draft_tokens new tokens, got {drafts}"
                )
        page = sc.page_size
        rows = [r.encoder + r.kv for r in sc.requests]  # req_to_token row: [encoder | decoder] tokens
        need = [max(1, -(-n // page)) for n in rows]
        num_pages = sum(need) + 1
        gen = torch.Generator().manual_seed(int(case.digest(), 16))
        perm = torch.randperm(num_pages, generator=gen).tolist()
        r2t = torch.zeros(len(rows), (max(rows) // page + 2) * page, dtype=torch.int32)
        cursor = 0
        for b, n in enumerate(rows):
            pages, cursor = perm[cursor : cursor + need[b]], cursor + need[b]
            r2t[b, :n] = torch.tensor([pages[t // page] * page + t % page for t in range(n)], dtype=torch.int32)
        seq_lens = [r.cached if sc.mode == "target_verify" else r.kv for r in sc.requests]
        mask = None
        if sc.tree:  # spec_info.custom_mask: per request (draft, seq_len + draft) row-major, flattened
            paths, d = _tree_paths(sc.tree), len(sc.tree)
            mask = torch.cat(
                [
                    torch.tensor([[True] * s + [j in paths[i] for j in range(d)] for i in range(d)]).flatten()
                    for s in seq_lens
                ]
            )
        st = _Step(sc, page, num_pages, r2t, seq_lens, mask)
        st.metadata = self.init_forward_metadata(st)
        self.check_metadata(st.metadata, page_size=page, num_pages=num_pages, total_q=case.total_q)
        self._plan_calls(case, st)
        return st

    # ------------------------------------------------------------------ init_forward_metadata
    def init_forward_metadata(self, st: _Step) -> SGLMetadata:
        sc, r2t, seq, page = st.scenario, st.req_to_token, st.seq_lens, st.page_size
        bs = len(seq)
        extend = [r.new for r in sc.requests]
        prefix = [r.cached for r in sc.requests]
        mode = "extend" if sc.mode == "mla_prefix" else sc.mode
        if mode == "decode":
            md = SGLMetadata(seq, list(range(bs + 1)), prefix_sums(seq), r2t[:, : max(seq)], 1, max(seq))
            self._init_local(sc, md)
        elif mode == "target_verify" and not sc.tree:  # top-k 1: one causal call over the draft tokens
            d = extend[0]
            lens = [s + d for s in seq]
            md = SGLMetadata(lens, list(range(0, bs * d + 1, d)), prefix_sums(lens), r2t[:, : max(lens)], d, max(lens))
            self._init_local(sc, md)
        elif mode == "target_verify":
            if page != 1:
                raise ValueError(
                    "page_size: top-k > 1 verify builds its expand page table from token slots (req_to_token), "
                    f"a page table only at page size 1, got {page} (SGLang allows it only for other backends)"
                )
            d = len(sc.tree)
            md = SGLMetadata(seq, list(range(0, bs * d + 1, d)), prefix_sums(seq), r2t[:, : max(seq)], d, max(seq))
            md.expand = self._expand_metadata(st, d)
            if sc.window is not None:
                md.swa_spec_metadata = self._swa_spec_metadata(md, md.expand, d)
        elif mode in ("extend", "mixed"):
            cu_k = prefix_sums(seq)
            md = SGLMetadata(seq, cu_k, cu_k, r2t[:, : max(seq)], max(seq), max(seq))
            if any(prefix):
                md.cu_seqlens_q, md.max_seq_len_q = prefix_sums(extend), max(extend)
            if mode == "extend":  # only ForwardMode.EXTEND sets up local attention (not MIXED)
                self._init_local(sc, md)
        else:
            raise ValueError(f"mode must be extend, mixed, decode or target_verify, got {sc.mode!r}")
        if sc.cross:
            enc = [r.encoder for r in sc.requests]
            if len(enc) != 1:
                raise ValueError(f"encoder_lens: 'Only encoder size 1 is supported for now', got {len(enc)}")
            md.encoder_lens_int32, md.encoder_cu_seqlens_k = enc, prefix_sums(enc)
            md.encoder_page_table = r2t[:, : enc[0]]
            md.page_table = r2t[:, enc[0] : enc[0] + md.max_seq_len_k]
        if page > 1:  # strided to pages for FA3 (after the local metadata, and not the encoder table)
            md.page_table = md.page_table[:, ::page] // page
        return md

    def _init_local(self, sc: Scenario, md: SGLMetadata) -> None:
        if sc.chunk is None:
            return
        table = self.local_page_table(md.page_table, sc.page_size)
        md.local_attn_metadata = self.virtual_batches(
            sc.chunk, md.cu_seqlens_q, md.cache_seqlens_int32, table, sc.page_size
        )

    def _expand_metadata(self, st: _Step, d: int) -> SGLMetadata:
        """The expand half of the top-k > 1 verify cascade, from the custom mask (the seed's construction)."""
        assert st.custom_mask is not None
        seq = torch.tensor(st.seq_lens, dtype=torch.long)
        offsets = torch.arange(d)[None, :]
        cols = offsets + seq[:, None]  # (bs, d): the draft tokens' positions in req_to_token
        row_start = torch.tensor(prefix_sums((seq + d).repeat_interleave(d).tolist())[:-1])  # each mask row's start
        mask = st.custom_mask[(cols.repeat_interleave(d, dim=0) + row_start[:, None]).flatten()].view(-1, d)
        order = torch.sort(torch.where(mask, offsets, offsets + d), dim=1).indices  # visible draft tokens first
        slots = st.req_to_token.long().gather(1, cols).repeat_interleave(d, dim=0)
        lens = mask.sum(dim=1).tolist()
        n = len(lens)
        return SGLMetadata(lens, list(range(n + 1)), prefix_sums(lens), slots.gather(1, order).to(torch.int32), 1, d)

    def _swa_spec_metadata(self, md: SGLMetadata, exp: SGLMetadata, d: int) -> SGLMetadata:
        """Sliding-window verify without cascade: each draft token over ``prefix + its visible draft tokens``."""
        rows = []
        for r, n in enumerate(exp.cache_seqlens_int32):
            s = md.cache_seqlens_int32[r // d]
            row = torch.zeros(md.max_seq_len_k + exp.page_table.shape[1], dtype=torch.int32)
            row[:s], row[s : s + n] = md.page_table[r // d, :s], exp.page_table[r, :n]
            rows.append(row)
        lens = [md.cache_seqlens_int32[r // d] + n for r, n in enumerate(exp.cache_seqlens_int32)]
        return SGLMetadata(lens, exp.cu_seqlens_q, prefix_sums(lens), torch.stack(rows), 1, max(lens))

    def check_metadata(self, md: SGLMetadata, *, page_size: int, num_pages: int, total_q: int) -> None:
        """Every table the step's calls may read, checked as :func:`check_call_metadata` does (fields named)."""
        kw = dict(page_size=page_size, num_pages=num_pages, total_q=total_q)
        check_call_metadata(_MAIN, md.page_table, md.cache_seqlens_int32, md.cu_seqlens_q, md.cu_seqlens_k, **kw)
        if md.encoder_lens_int32 is not None:
            if md.encoder_page_table is None:
                raise ValueError(
                    f"encoder_page_table: encoder_lens_int32 is {md.encoder_lens_int32} but there is no encoder page "
                    "table for cross attention to read"
                )
            check_call_metadata(
                _ENCODER, md.encoder_page_table, md.encoder_lens_int32, md.cu_seqlens_q, md.encoder_cu_seqlens_k, **kw
            )
        vb = md.local_attn_metadata
        if vb is not None:
            check_call_metadata(_LOCAL, vb.block_table_local, vb.seqlens_k_local, vb.cu_seqlens_q_local, None, **kw)
        for prefix, sub in (("expand.", md.expand), ("swa_spec_metadata.", md.swa_spec_metadata)):
            if sub is not None:
                check_call_metadata(
                    _prefixed(prefix), sub.page_table, sub.cache_seqlens_int32, sub.cu_seqlens_q, sub.cu_seqlens_k, **kw
                )

    # ------------------------------------------------------------------ forward_extend / forward_decode: the calls
    def _paged(self, case: AttentionCase, label: str, m: SGLMetadata, causal: bool, window, names) -> _KCall:
        """One ``flash_attn_with_kvcache`` call reading ``m``'s table, lengths and offsets (``m.cu_seqlens_k`` is
        what the call passes as ``cu_seqlens_k_new``, None where it passes none).  MLA's absorbed calls pass no
        window (the seed's MLA path)."""
        cu_q, lens = m.cu_seqlens_q, m.cache_seqlens_int32
        reqs = [(b - a, n) for a, b, n in zip(cu_q, cu_q[1:], lens)]
        window = (None, None) if self.scenario(case).mla else window
        fp8 = dict(descale="head") if case.quant_family == "fp8" else {}  # FA3's (batch, hk) descales
        call = call_case(case, reqs, causal=causal, window=window, chunk=None, **fp8)
        return _KCall(label, call, names, m.page_table, lens, cu_q, m.cu_seqlens_k)

    def _plan_calls(self, case: AttentionCase, st: _Step) -> None:
        """The calls ``forward_extend`` / ``forward_decode`` make for this step, in order, and how they combine."""
        sc, md = st.scenario, st.metadata
        assert md is not None
        left, right = self.window_size(sc.window)  # FA3's spelling: -1 = unbounded
        win = (None if left < 0 else left, None if right < 0 else right)
        vb = md.local_attn_metadata
        if sc.cross:  # layer.is_cross_attention: the encoder's table and lengths, no causal mask, no window
            m = SGLMetadata(
                md.encoder_lens_int32 or [], md.cu_seqlens_q, md.encoder_cu_seqlens_k or [], md.encoder_page_table
            )
            st.calls = [self._paged(case, "cross attention (encoder page table)", m, False, (None, None), _ENCODER)]
        elif sc.chunk is not None and vb is not None:  # use_local_attn (decode passes no window)
            m = SGLMetadata(vb.seqlens_k_local, vb.cu_seqlens_q_local, None, vb.block_table_local)
            w = win if sc.mode != "decode" else (None, None)
            st.calls = [self._paged(case, "local attention (virtual batches)", m, True, w, _LOCAL)]
        elif md.swa_spec_metadata is not None:  # sliding window with top-k > 1: no cascade
            label, names = "verify (sliding window, draft tokens expanded)", _prefixed("swa_spec_metadata.")
            st.calls = [self._paged(case, label, md.swa_spec_metadata, True, win, names)]
        elif sc.mode == "target_verify" and sc.tree:  # use_cascade_attn
            assert md.expand is not None
            st.calls = [
                self._paged(case, "verify prefix (committed cache, non-causal)", md, False, win, _MAIN),
                self._paged(
                    case, "verify draft tree (expand, non-causal)", md.expand, False, win, _prefixed("expand.")
                ),
            ]
            st.combine = "cascade"
        elif sc.mode == "mla_prefix":
            lens = [r.new for r in sc.requests]
            kc = _KCall("extend (new tokens, causal)", call_case(case, [(n, n) for n in lens], causal=True))
            kc.spans = [(r.cached, r.kv) for r in sc.requests]
            st.calls = [kc]
            size = sc.chunk_capacity // len(lens)
            for i in range(-(-max(r.cached for r in sc.requests) // size)):
                spans = [(min(i * size, r.cached), min((i + 1) * size, r.cached)) for r in sc.requests]
                reqs = [(n, e - s) for n, (s, e) in zip(lens, spans)]
                kc = _KCall(f"prefix chunk {i} (non-causal)", call_case(case, reqs, causal=False))
                kc.spans = spans
                st.calls.append(kc)
            st.combine = "chunked_prefix"
        else:
            st.calls = [self._paged(case, f"{sc.mode} (page table)", md, True, win, _MAIN)]
        if sc.fp8:
            for kc in st.calls:
                if kc.case.batch != len(sc.requests):
                    raise ValueError(
                        f"k_descale: expanded to (batch_size={len(sc.requests)}, hk) but call {kc.label!r} has "
                        f"{kc.case.batch} sequences (FA3: CHECK_SHAPE(k_descale, batch_size, num_heads_k))"
                    )

    def plan(self, case: AttentionCase) -> list[tuple[str, AttentionCase]]:
        return [(kc.label, kc.case) for kc in self._step(case).calls]

    # ------------------------------------------------------------------ forward
    def _pool(self, case: AttentionCase, inputs: CaseInputs, st: _Step) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's K/V buffers with every key written through ``req_to_token`` (set_kv_buffer); MLA: one
        ``[c_kv | k_rope]`` buffer (set_mla_kv_buffer), returned twice; fp8: the stored fp8 values."""
        sc, page, dev = st.scenario, st.page_size, inputs.device
        quant = inputs.quant
        k_all = inputs.k if quant is None else quant.k
        v_all = inputs.v if quant is None else quant.v
        assert v_all is not None
        if sc.mla:
            k_all = v_all = torch.cat([v_all, k_all], dim=-1)
        hk, dt = k_all.shape[1], k_all.dtype
        kbuf = torch.full((st.num_pages, page, hk, k_all.shape[2]), STALE).to(dev, dt)
        vbuf = kbuf if sc.mla else torch.full((st.num_pages, page, hk, v_all.shape[2]), STALE).to(dev, dt)
        cu_k = [int(x) for x in inputs.cu_seqlens_k.tolist()]
        slots = torch.cat([st.req_to_token[b, :kl].long() for b, kl in enumerate(case.kv_lens)]).to(dev)
        written = torch.cat([torch.arange(cu_k[b], cu_k[b + 1]) for b in range(case.batch)]).to(dev)
        write_kv_cache(k_all[written], v_all[written], kbuf, vbuf, slots)
        return kbuf, vbuf

    def _run(self, kc: _KCall, case: AttentionCase, inputs: CaseInputs, st: _Step, pool, kernel: Kernel):
        sc = st.scenario
        if kc.spans is not None:  # MLA chunked prefix: flash_attn_varlen_func over contiguous k/v
            cu = [int(x) for x in inputs.cu_seqlens_k.tolist()]
            k = torch.cat([inputs.k[cu[b] + s : cu[b] + e] for b, (s, e) in enumerate(kc.spans)])
            v = torch.cat([inputs.v[cu[b] + s : cu[b] + e] for b, (s, e) in enumerate(kc.spans)])
            return kernel(contiguous_call(kc.label, kc.case, inputs.q, k, v, sinks=inputs.sinks))
        check_call_metadata(
            kc.names,
            kc.table,
            kc.lens,
            kc.cu_q,
            kc.cu_k,
            page_size=st.page_size,
            num_pages=st.num_pages,
            total_q=case.total_q,
        )
        dev = inputs.device
        table = kc.table.to(dev)
        k_cache, v_cache = pool
        mla_cache = None
        if sc.mla:
            k_cache, v_cache = self.split_mla_cache(k_cache, case.dv)
            mla_cache = torch.cat([v_cache, k_cache], dim=-1)  # the joint cache as the engine's views describe it
        k, _ = gather_kv(k_cache, table, kc.lens)
        v, _ = gather_kv(v_cache, table, kc.lens)
        quant = None
        if inputs.quant is not None:
            q8, hk, n = inputs.quant, case.num_kv_heads, len(sc.requests)
            assert q8.v_descale is not None and q8.q_descale is not None
            kd, vd = self.descales(q8.k_descale, n, hk), self.descales(q8.v_descale, n, hk)
            quant = QuantTensors(
                q8.fmt, k=k, k_descale=kd, q=q8.q, q_descale=expand_descale(q8.q_descale, n, hk), v=v, v_descale=vd
            )
            rows = torch.repeat_interleave(torch.arange(n, device=dev), torch.tensor(kc.lens, device=dev))
            k, v = k.float() * kd[rows][..., None], v.float() * vd[rows][..., None]  # dequantized, for fakes
        cal = call_inputs(
            kc.case,
            q=inputs.q,
            k=k,
            v=v,
            cu_seqlens_q=torch.tensor(kc.cu_q, dtype=torch.int32, device=dev),
            cu_seqlens_k=torch.tensor(prefix_sums(kc.lens), dtype=torch.int32, device=dev),
            k_cache=k_cache,
            v_cache=v_cache,
            block_table=table,
            sinks=inputs.sinks,
            qv=inputs.qv,
            quant=quant,
            mla_cache=mla_cache,
        )
        return kernel(Call(kc.label, kc.case, cal))

    def forward(self, case: AttentionCase, inputs: CaseInputs, kernel: Kernel) -> KernelOutput:
        st = self._step(case)
        pool = self._pool(case, inputs, st) if case.paged else None
        results = [self._run(kc, case, inputs, st, pool, kernel) for kc in st.calls]
        if st.combine == "single":
            return results[0]
        if any(r.lse is None for r in results):
            raise ValueError(f"{st.combine}: the merge needs every call's LSE; this backend returned none")
        if st.combine == "cascade":
            a, b = results
            out, lse = self.merge_state(a.out, a.lse.transpose(0, 1), b.out, b.lse.transpose(0, 1))
        else:  # chunked prefix: each chunk merged into the running result (new tokens first)
            out, lse = results[0].out, results[0].lse.transpose(0, 1)
            for r in results[1:]:
                out, lse = self.merge_state(r.out, r.lse.transpose(0, 1), out, lse)
        return KernelOutput(out, lse.transpose(0, 1))

    # ------------------------------------------------------------------ the layer's reference
    def _tree_layer(self, case: AttentionCase, inputs: CaseInputs) -> tuple[AttentionCase, CaseInputs]:
        """Top-k > 1 verify as plain attention: each draft token one sequence over the prefix and its ancestors."""
        sc = self.scenario(case)
        paths = _tree_paths(sc.tree)
        cu = [int(x) for x in inputs.cu_seqlens_k.tolist()]
        idx, reqs = [], []
        for b, r in enumerate(sc.requests):
            for path in paths:
                keys = list(range(cu[b], cu[b] + r.cached)) + [cu[b] + r.cached + j for j in path]
                idx += keys
                reqs.append((1, len(keys)))
        tree = call_case(case, reqs, kv_layout="contiguous", block_size=None, causal=True)
        sel = torch.tensor(idx, device=inputs.device)
        dev = inputs.device
        ins = call_inputs(
            tree,
            q=inputs.q,
            k=inputs.k[sel],
            v=inputs.v[sel],
            cu_seqlens_q=torch.arange(len(reqs) + 1, device=dev),
            cu_seqlens_k=torch.tensor(prefix_sums([n for _, n in reqs]), device=dev),
            sinks=inputs.sinks,
        )
        return tree, ins

    def reference(self, case: AttentionCase, inputs: CaseInputs) -> AttnResult:
        if not self.scenario(case).tree:
            return super().reference(case, inputs)
        from conformance.verdict.reference import reference

        return reference(*self._tree_layer(case, inputs))

    def baseline(self, case: AttentionCase, inputs: CaseInputs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.scenario(case).tree:
            return super().baseline(case, inputs)
        from conformance.verdict.baseline import baseline

        return baseline(*self._tree_layer(case, inputs))
