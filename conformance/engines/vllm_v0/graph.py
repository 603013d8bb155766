"""Seed ``002``'s CUDA-graph decode: ``graph_block_tables``, padded slots and ``use_cuda_graph``, captured at a
bucket and replayed for every batch size up to it (the graph scenarios of the engine ``vllm_v0_fa``).

What the seed's ``FlashAttentionMetadataBuilder.build(seq_lens, query_lens, cuda_graph_pad_size, batch_size)``
writes for a captured decode batch (:meth:`V0GraphRun.build`, literally):

* ``use_captured_graph = cuda_graph_pad_size != -1``; ``slot_mapping`` extended with ``PAD_SLOT_ID`` for the padded
  requests (their cache writes are skipped); ``self.block_tables.extend([] * cuda_graph_pad_size)``, which extends by
  nothing (``[] * n`` is ``[]``), so only the real requests have block lists;
* ``_get_graph_runner_block_tables(num_seqs, block_tables)``: the runner's persistent ``graph_block_tables``
  ``(max_batch_size, max_blocks)``, rows ``[:num_seqs]``; each real row's first ``len(block_table)`` entries
  overwritten (a longer list cut at ``max_blocks``), everything else keeps what earlier batches wrote: entries past
  a request's pages and the padded rows are stale block ids;
* ``num_decode_tokens = batch_size - num_prefill_tokens`` (the padded batch), ``use_cuda_graph=True``.

The runner side (vLLM V0's ``model_runner.py``, not in the seed): the batch is padded to the captured size with
``seq_lens`` of 1 per padded request; ``CUDAGraphRunner.forward`` copies ``seq_lens_tensor`` and ``block_tables``
into the graph's input buffers before replaying.  The decode call is ``flash_attn_with_kvcache`` with
``cache_seqlens = seq_lens_tensor`` and ``block_table = block_tables`` (the seed's decode path for
``max_decode_query_len == 1``; V0 captures decode only).

A bug that leaves a stale row where a real request's table should be reads another batch's pages and fails the
layer's numerical verdict; each replay is also compared bitwise with the same call run eagerly on the same buffers.
A batch larger than the bucket (``graph_block_tables``' rows) or a sequence longer than its columns raises
``ValueError`` naming the field and the bucket.
"""

from __future__ import annotations

import torch

from attnfast.base import KernelOutput
from attnref import write_kv_cache
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.graphs.captured import CapturedCall
from conformance.graphs.composed import ComposedRun

from ..base import Request
from ..calls import STALE, call_case, token_slots
from ..v0_graph_common import PAD_SEQ_LEN, GraphScenario, bucket_width, decode_lists, graph_case, replay_batches
from ..v0_graph_common import check_graph_case as _check_graph_case
from ..v0_graph_common import decodes as _d
from ..v0_graph_common import get_graph_runner_block_tables as _graph_runner_block_tables

__all__ = ["GRAPH_SCENARIOS", "GraphScenario", "V0GraphRun", "captured_call", "check_graph_case", "graph_case"]

#: Capture at the bucket, then shorter batches (stale rows past them) and longer sequences than the capture's.
GRAPH_SCENARIOS: dict[str, GraphScenario] = {
    "graph_decode": GraphScenario(
        (_d(33, 7, 90, 15), _d(120), _d(2, 64), _d(49, 1, 17), _d(70, 8, 111, 30)),
        dict(num_heads=8, num_kv_heads=2, head_dim=64, dtype="bf16", kv_layout="NHD", block_size=16, causal=True),
    ),
    "graph_decode_bs256": GraphScenario(
        (_d(300, 20, 130), _d(470), _d(5, 260), _d(90, 400, 1)),
        dict(num_heads=4, num_kv_heads=4, head_dim=128, dtype="fp16", kv_layout="NHD", block_size=256, causal=True),
    ),
}


def check_graph_case(case: AttentionCase, sc: GraphScenario) -> None:
    """``ValueError`` naming the field when ``case`` is not the graph scenario it names."""
    _check_graph_case(case, sc, "V0")


def captured_call(case: AttentionCase) -> AttentionCase:
    """The decode call the graph captures: the bucket's requests of one query at ``max_blocks * block_size`` keys."""
    bs = case.block_size or 16
    return call_case(case, [(1, bucket_width(case) * bs)] * case.graph[0], graph=(), graph_fill=0)


class V0GraphRun(ComposedRun):
    """The callable the engine's ``prepare`` returns for a graph scenario: capture at the bucket, replay each batch."""

    def __init__(self, case, inputs, backend, device, call: AttentionCase, seed: int = 0) -> None:
        super().__init__(case, inputs, backend, device)
        self.call, self.seed = call, seed

    def _allocate(self) -> None:
        case, dev = self.case, self.inputs.device
        self.bucket, self.bs, self.width = case.graph[0], case.block_size or 16, bucket_width(case)
        b, h, hk, d = self.bucket, case.num_heads, case.num_kv_heads, case.head_dim
        self.num_blocks = b * self.width + 1
        # the runner's persistent host array (np.zeros((max_batch_size, max_blocks), dtype=np.int32) in V0)
        self.graph_block_tables = torch.zeros(b, self.width, dtype=torch.int32)
        cache = torch.full((2, self.num_blocks, self.bs, hk, d), STALE, dtype=torch.float32).to(dev, case.torch_dtype)
        self.buffers = CaseInputs(  # CUDAGraphRunner's input buffers
            case=self.call,
            q=torch.full((b, h, d), STALE, dtype=case.torch_dtype, device=dev),
            k=torch.zeros(0, hk, d, dtype=case.torch_dtype, device=dev),
            v=torch.zeros(0, hk, d, dtype=case.torch_dtype, device=dev),
            cu_seqlens_q=torch.arange(0, b + 1, dtype=torch.int32, device=dev),
            cu_seqlens_k=torch.zeros(b + 1, dtype=torch.int32, device=dev),
            seqlens_k=torch.zeros(b, dtype=torch.int32, device=dev),
            k_cache=cache[0],
            v_cache=cache[1],
            block_table=torch.zeros(b, self.width, dtype=torch.int32, device=dev),
        )
        self.gen = torch.Generator().manual_seed(int(case.digest(), 16) + self.seed)

    # ------------------------------------------------------------------ the seed's build (planted bugs override)
    def get_graph_runner_block_tables(self, num_seqs: int, block_tables: list[list[int]]) -> torch.Tensor:
        """The seed's ``_get_graph_runner_block_tables``: real rows' first entries written, the rest kept."""
        return _graph_runner_block_tables(num_seqs, block_tables, self.graph_block_tables)

    def build(self, live: list[Request]) -> tuple[list[int], list[int], torch.Tensor]:
        """``(seq_lens, slot_mapping, block_tables)`` of the padded batch, and the cache pages of the live requests
        (block manager: shuffled ids) written with their context (earlier steps) and the step's new token."""
        perm = torch.randperm(self.num_blocks - 1, generator=self.gen).tolist()
        seq_lens, slot_mapping, block_tables = decode_lists(live, perm, self.bucket, self.width, self.bs)
        return seq_lens, slot_mapping, self.get_graph_runner_block_tables(len(seq_lens), block_tables)

    def write_batch(self, group: list[int], live: list[Request], tables: torch.Tensor, slot_mapping: list[int]):
        """The context earlier steps cached, the step's new tokens through ``slot_mapping`` (pads skipped), q."""
        buf, bs = self.buffers, self.bs
        cu_q, cu_k = self.inputs.cu_seqlens_q.tolist(), self.inputs.cu_seqlens_k.tolist()
        ks, vs, ctx_slots, new_rows = [], [], [], []
        for slot, (r, req) in enumerate(zip(group, live)):
            row = tables[slot].tolist()
            ctx_slots += token_slots(row, range(req.cached), bs)
            ks.append(self.inputs.k[cu_k[r] : cu_k[r] + req.cached])
            vs.append(self.inputs.v[cu_k[r] : cu_k[r] + req.cached])
            new_rows += list(range(cu_k[r] + req.cached, cu_k[r + 1]))
            buf.q[slot] = self.inputs.q[cu_q[r]]
        dev = buf.q.device
        k_cache, v_cache = buf.k_cache, buf.v_cache
        assert k_cache is not None and v_cache is not None
        if ctx_slots:
            flat = torch.tensor(ctx_slots, dtype=torch.int64, device=dev)
            write_kv_cache(torch.cat(ks), torch.cat(vs), k_cache, v_cache, flat, layout="NHD")
        new = torch.tensor(new_rows, dtype=torch.long, device=dev)
        k_new = torch.cat([self.inputs.k[new], self.inputs.k.new_zeros(self.bucket - len(live), *buf.k.shape[1:])])
        v_new = torch.cat([self.inputs.v[new], self.inputs.v.new_zeros(self.bucket - len(live), *buf.v.shape[1:])])
        sm = torch.tensor(slot_mapping, dtype=torch.int64, device=dev)  # reshape_and_cache_flash: -1 skipped
        write_kv_cache(k_new, v_new, k_cache, v_cache, sm, layout="NHD")

    def copy_inputs(self, seq_lens: list[int], tables: torch.Tensor) -> None:
        """``CUDAGraphRunner.forward``: ``seq_lens_tensor`` and ``block_tables`` into the graph's input buffers."""
        buf = self.buffers
        assert buf.block_table is not None
        buf.seqlens_k.copy_(torch.tensor(seq_lens, dtype=torch.int32))
        buf.cu_seqlens_k.copy_(torch.cumsum(torch.tensor([0] + seq_lens), 0).to(torch.int32))
        buf.block_table.copy_(tables)

    def run(self) -> KernelOutput:
        self._allocate()
        case, captured = self.case, None
        outs = []
        for _, _, group, live in replay_batches(case, self.bucket):
            seq_lens, slot_mapping, tables = self.build(live)
            self.write_batch(group, live, tables, slot_mapping)
            self.copy_inputs(seq_lens, tables)
            if captured is None:
                captured = CapturedCall.kernel(
                    self.backend, self.device, self.call, self.buffers, self.notes, self.problems
                )
            got, _, _ = captured.replay([(1, case.kv_lens[r]) for r in group])
            outs.append(got.out)
        assert captured is not None
        bucket = {"batch": self.bucket, "q_len": 1, "width": self.width, "fill": PAD_SEQ_LEN}
        self.extra["graph"] = captured.summary(bucket)  # V0 pins no split count: promised False
        return KernelOutput(torch.cat(outs), None)  # V0's forward returns no LSE
