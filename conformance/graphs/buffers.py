"""A CUDA-graph bucket's static buffers, and how each replay batch is written into them in place.

An engine captures its decode step once per *bucket* (a maximum batch, a maximum of pages per request) on
buffers allocated for that bucket, and before every later replay refills the same buffers: the queries, the
block table, the live key counts (``seqused_k``, the cumulative ``cu_seqlens_k``), the cache pages.  A batch
with fewer requests than the bucket is padded: the padded requests keep a key count at the engine's fill value
(vLLM's padded ``seq_lens`` are 0, SGLang's ``get_cuda_graph_seq_len_fill_value()`` is 1) and whatever block
ids their table rows held.

:class:`Bucket` derives the bucket of a graph case (``AttentionCase.graph``: the number of requests of each
replay batch, the capture batch first; the requests are the batches one after the other) and
:class:`GraphBuffers` holds its tensors.  :func:`GraphBuffers.write` lays one batch out so that a kernel that
reads past what it should shows it:

* block ids are handed out shuffled afresh for every batch, so a request's pages move between replays (a kernel
  or engine that keeps the capture batch's table reads another request's keys);
* every table entry past a request's last page, and every entry of a padded row, holds a random *valid* block
  id: a decoy block of large values or a page of another request (a read past ``seqused_k`` shows, and stays
  in bounds);
* query rows and pages a batch does not use keep what earlier batches wrote (stale, as in an engine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnref import write_kv_cache
from attnref.paged import as_layout
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

__all__ = ["Bucket", "GraphBuffers", "DECOY_SCALE", "bucket_refusal"]

#: Magnitude of the decoy blocks' values: a kernel reading one changes its output far beyond any tolerance.
DECOY_SCALE = 100.0


def bucket_refusal(case: AttentionCase) -> str:
    """Why the bucket buffers cannot hold ``case`` (``""`` when they can): what the graph composition refuses up
    front (:meth:`conformance.graphs.replay.GraphReplay.refuses`), so such a case is unsupported, not an error."""
    if case.qv and case.kv_layout == "HND":
        return (
            "graph: an MLA (qv) bucket is NHD only (FlashMLA's layout: one [c_kv | k_rope] cache whose V and K are "
            "views of it)"
        )
    return ""


@dataclass(frozen=True)
class Bucket:
    """The capture bucket of a graph case.

    Attributes:
        batch: requests the buffers hold (the largest replay batch).
        q_len: query tokens per request (1 for decode, ``1 + k`` for a speculative verify).
        width: block-table columns per request: the longest request's pages plus one, so that every request's
            row has entries past its last page.
        block_size: the cache's page size.
        decoys: blocks no request ever owns, filled with large values.
        fill: the key count of a padded request (``AttentionCase.graph_fill``).
    """

    batch: int
    q_len: int
    width: int
    block_size: int
    decoys: int
    fill: int

    @classmethod
    def of(cls, case: AttentionCase) -> "Bucket":
        if not case.graph:
            raise ValueError("Bucket.of needs a graph case (AttentionCase.graph set)")
        bs = case.block_size
        assert bs is not None
        width = math.ceil(max(case.kv_lens) / bs) + 1
        return cls(max(case.graph), case.q_lens[0], width, bs, width, case.graph_fill)

    @property
    def capacity(self) -> int:
        """Keys a request can hold: ``width * block_size`` (what a captured call passes as ``max_seqlen_k``)."""
        return self.width * self.block_size

    @property
    def num_blocks(self) -> int:
        return self.batch * self.width + self.decoys

    def call_case(self, case: AttentionCase) -> AttentionCase:
        """The call the graph captures: ``batch`` requests of ``q_len`` queries at the bucket's capacity."""
        return case.replace(requests=((self.q_len, self.capacity),) * self.batch, graph=(), graph_fill=0, batch_name="")

    def groups(self, case: AttentionCase) -> list[list[int]]:
        """Request indices of each replay batch, in case order (the capture batch first)."""
        out, start = [], 0
        for n in case.graph:
            out.append(list(range(start, start + n)))
            start += n
        return out

    def check_fits(self, case: AttentionCase, group: list[int]) -> None:
        """``ValueError`` naming the field and the bucket when a batch does not fit the captured buffers."""
        if len(group) > self.batch:
            raise ValueError(f"replay batch of {len(group)} requests exceeds the captured bucket of {self.batch}")
        for r in group:
            q_len, kv_len = case.requests[r]
            if q_len != self.q_len:
                raise ValueError(f"requests[{r}] q_len {q_len} differs from the bucket's q_len {self.q_len}")
            if kv_len > self.capacity - self.block_size:
                raise ValueError(
                    f"requests[{r}] kv_len {kv_len} exceeds the bucket's {self.width - 1} pages of "
                    f"{self.block_size} keys"
                )


@dataclass
class GraphBuffers:
    """The static tensors of a bucket, on the case's device; ``inputs`` is the bucket call's ``CaseInputs``
    (``case`` = :meth:`Bucket.call_case`) whose tensors *are* these buffers, which is what a graph-mode adapter
    reads (:meth:`attnfast.base.Backend.prepare_graph`)."""

    bucket: Bucket
    inputs: CaseInputs
    generator: torch.Generator

    @classmethod
    def allocate(cls, case: AttentionCase, source: CaseInputs, seed: int) -> "GraphBuffers":
        """Buffers for ``case``'s bucket, with ``source``'s dtypes, per-layer tensors (sinks, ALiBi slopes) and
        device; the decoy blocks and every unused slot start at large random values."""
        refused = bucket_refusal(case)
        if refused:
            raise ValueError(refused)
        bucket = Bucket.of(case)
        gen = torch.Generator().manual_seed(seed * 7919 + 17)
        dev, dt = source.device, case.torch_dtype
        b, ql, h, hk, d, dv = bucket.batch, bucket.q_len, case.num_heads, case.num_kv_heads, case.head_dim, case.dv
        blocks, bs = bucket.num_blocks, bucket.block_size

        def noise(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen) * DECOY_SCALE).to(dev, dt)

        call = bucket.call_case(case)
        q = noise(b * ql, h, d)
        qv = noise(b * ql, h, dv) if case.qv else None
        mla_cache = None
        if case.qv:  # FlashMLA's single cache [c_kv | k_rope]; V and K are views of it (as vLLM's MLA layers)
            mla_cache = noise(blocks, bs, hk, dv + d)
            k_cache, v_cache = mla_cache[..., dv:], mla_cache[..., :dv]
        else:
            k_cache, v_cache = noise(blocks, bs, hk, d), noise(blocks, bs, hk, dv)
        if case.kv_layout == "HND":
            k_cache, v_cache = k_cache.transpose(1, 2).contiguous(), v_cache.transpose(1, 2).contiguous()
        inputs = CaseInputs(
            case=call,
            q=q,
            k=torch.zeros(0, hk, d, dtype=dt, device=dev),
            v=torch.zeros(0, hk, dv, dtype=dt, device=dev),
            cu_seqlens_q=torch.arange(0, (b + 1) * ql, ql, dtype=torch.int32, device=dev),
            cu_seqlens_k=torch.zeros(b + 1, dtype=torch.int32, device=dev),
            seqlens_k=torch.zeros(b, dtype=torch.int32, device=dev),
            alibi_slopes=source.alibi_slopes,
            sinks=source.sinks,
            k_cache=k_cache,
            v_cache=v_cache,
            block_table=torch.zeros(b, bucket.width, dtype=torch.int32, device=dev),
            qv=qv,
            mla_cache=mla_cache,
        )
        return cls(bucket, inputs, gen)

    def write(self, case: AttentionCase, source: CaseInputs, group: list[int]) -> None:
        """Lay the requests ``group`` of ``case`` (their tensors in ``source``) into the buffers, in place."""
        bucket, buf = self.bucket, self.inputs
        bucket.check_fits(case, group)
        bs, width = bucket.block_size, bucket.width
        cu_q, cu_k = source.cu_seqlens_q.tolist(), source.cu_seqlens_k.tolist()
        owned = bucket.batch * width  # block ids below this are pages; the decoys come after
        perm = torch.randperm(owned, generator=self.generator).tolist()
        table = torch.randint(0, bucket.num_blocks, (bucket.batch, width), generator=self.generator, dtype=torch.int32)
        lens = [bucket.fill] * bucket.batch
        keys, values, slots = [], [], []
        for slot, r in enumerate(group):
            kv = case.kv_lens[r]
            pages = perm[slot * width : slot * width + math.ceil(kv / bs)]
            table[slot, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
            lens[slot] = kv
            rows = slice(slot * bucket.q_len, (slot + 1) * bucket.q_len)
            buf.q[rows] = source.q[cu_q[r] : cu_q[r + 1]]
            if buf.qv is not None and source.qv is not None:
                buf.qv[rows] = source.qv[cu_q[r] : cu_q[r + 1]]
            keys.append(source.k[cu_k[r] : cu_k[r + 1]])
            values.append(source.v[cu_k[r] : cu_k[r + 1]])
            slots += [pages[t // bs] * bs + t % bs for t in range(kv)]
        dev = buf.q.device
        if slots:
            flat = torch.tensor(slots, dtype=torch.int64, device=dev)
            k_cache, v_cache = buf.k_cache, buf.v_cache
            assert k_cache is not None and v_cache is not None
            write_kv_cache(torch.cat(keys), torch.cat(values), k_cache, v_cache, flat, layout=as_layout(case.kv_layout))
        assert buf.block_table is not None
        buf.block_table.copy_(table.to(dev))
        buf.seqlens_k.copy_(torch.tensor(lens, dtype=torch.int32))
        buf.cu_seqlens_k.copy_(torch.tensor([0] + list(_cumsum(lens)), dtype=torch.int32))

    def exact(self, case: AttentionCase, group: list[int]) -> CaseInputs:
        """The batch just written as an ordinary (eager) call: views of the buffers' first ``len(group)`` rows,
        with the batch's own case (its real key counts); what an engine without graphs would have called."""
        buf, n, ql = self.inputs, len(group), self.bucket.q_len
        call = case.replace(requests=tuple(case.requests[r] for r in group), graph=(), graph_fill=0, batch_name="")
        assert buf.block_table is not None
        return CaseInputs(
            case=call,
            q=buf.q[: n * ql],
            k=buf.k,
            v=buf.v,
            cu_seqlens_q=buf.cu_seqlens_q[: n + 1],
            cu_seqlens_k=buf.cu_seqlens_k[: n + 1],
            seqlens_k=buf.seqlens_k[:n],
            alibi_slopes=buf.alibi_slopes,
            sinks=buf.sinks,
            k_cache=buf.k_cache,
            v_cache=buf.v_cache,
            block_table=buf.block_table[:n],
            qv=None if buf.qv is None else buf.qv[: n * ql],
            mla_cache=buf.mla_cache,
        )


def _cumsum(xs: list[int]):
    total = 0
    for x in xs:
        total += x
        yield total
