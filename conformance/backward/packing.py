"""Training-style batches: how training frameworks turn a batch into one varlen attention call, and back.

A training step reaches a varlen kernel (``flash_attn_varlen_func`` and its kin) in one of two ways:

* **Packing** (padding-free training): documents concatenated in a row, position ids restarting at 0 at each
  document.  Transformers derives the kernel's ``cu_seqlens`` from the position ids alone: every token whose id is
  the first id (0 for decoder models) starts a document, the number of tokens closes the list, and ``max_seqlen``
  is the largest difference (huggingface/transformers ``src/transformers/modeling_flash_attention_utils.py``,
  ``prepare_fa_kwargs_from_position_ids``; older releases, e.g. commit 7713be1e, do the same in
  ``prepare_fa2_from_position_ids`` with ``position_ids.max() + 1`` as the max length).  The (batch, seqlen)
  position ids are flattened first, so every row must itself start a document: :func:`packing_from_position_ids`
  checks that (and that ids count up by one within a document), which transformers does not.
* **Unpadding**: a padded batch ``(batch, seqlen, ...)`` with an attention mask (1 valid, 0 padding).
  flash-attn's ``flash_attn/bert_padding.py`` ``unpad_input`` takes ``seqlens = mask.sum(-1)``, the ``indices`` of
  the valid tokens in the flattened ``(batch * seqlen)`` axis, ``cu_seqlens`` (int32, a leading 0) and
  ``max_seqlen``, and gathers the valid tokens; ``pad_input`` scatters the kernel's output back into zeros of
  ``(batch * seqlen, ...)`` (commits 2d64d7a5 and 3c0d4953).  :func:`unpad_mask`, :func:`unpad` and :func:`pad` do
  the same with plain indexing (differentiable: the gradient of a padded position is zero), after checking the mask
  follows one padding convention (``right``: training collators; ``left``: batched generation).

:func:`training_case` turns either batch into the :class:`~conformance.cases.case.AttentionCase` the harness judges:
one causal request ``(n, n)`` per document (per row for a padded batch), ``backward=True``; :func:`check_roundtrip`
checks a case (and its inputs' ``cu_seqlens``) against the batch it was built from, and :func:`case_position_ids`
gives the packed position ids a case stands for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from conformance.cases.case import AttentionCase

__all__ = [
    "PADDING_SIDES",
    "Packing",
    "Unpadded",
    "case_position_ids",
    "check_roundtrip",
    "cu_seqlens_of",
    "pad",
    "packing_from_position_ids",
    "position_ids_for",
    "training_case",
    "unpad",
    "unpad_mask",
]

PADDING_SIDES = ("right", "left")
#: Fields :func:`training_case` sets from the batch (a training call is causal self-attention over each document).
_SET_BY_BATCH = ("requests", "causal", "backward")


def cu_seqlens_of(lengths: Sequence[int]) -> torch.Tensor:
    """``[0, l0, l0 + l1, ...]`` as int32 (the kernels' ``cu_seqlens``)."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    if lengths:
        out[1:] = torch.cumsum(torch.tensor(list(lengths), dtype=torch.int64), 0).to(torch.int32)
    return out


@dataclass(frozen=True)
class Packing:
    """A packed batch as the kernel sees it: ``cu_seqlens`` (int32, ``(docs + 1,)``), ``max_seqlen``, and the
    document lengths, in order and per row."""

    cu_seqlens: torch.Tensor
    max_seqlen: int
    doc_lens: tuple[int, ...]
    row_docs: tuple[tuple[int, ...], ...]

    @property
    def requests(self) -> tuple[tuple[int, int], ...]:
        """One causal self-attention request ``(n, n)`` per document."""
        return tuple((n, n) for n in self.doc_lens)


@dataclass(frozen=True)
class Unpadded:
    """What :func:`unpad_mask` derives from an attention mask, as flash-attn's ``unpad_input`` does: ``indices``
    (int64, the valid tokens' positions in the flattened ``batch * seqlen`` axis), ``cu_seqlens`` (int32,
    ``(batch + 1,)``), ``max_seqlen``, and the per-row lengths and padded shape."""

    indices: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    seqlens: tuple[int, ...]
    batch: int
    seqlen: int
    padding_side: str = "right"

    @property
    def requests(self) -> tuple[tuple[int, int], ...]:
        """One causal self-attention request ``(n, n)`` per row (its valid tokens)."""
        return tuple((n, n) for n in self.seqlens)

    @property
    def total(self) -> int:
        return int(self.indices.numel())


# ---------------------------------------------------------------------------- packing
def _positive_lengths(name: str, lengths: Any) -> tuple[int, ...]:
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence) or not lengths:
        raise ValueError(f"{name} must be a non-empty sequence of document lengths, got {lengths!r}")
    out = []
    for i, n in enumerate(lengths):
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"{name}[{i}] must be a positive int (a document's tokens), got {n!r}")
        out.append(n)
    return tuple(out)


def position_ids_for(row_docs: Sequence[Sequence[int]]) -> torch.Tensor:
    """The ``(rows, seqlen)`` int64 position ids of documents packed into rows, ids restarting at 0 at each document
    (what a flattening collator emits); every row must hold the same number of tokens."""
    if isinstance(row_docs, (str, bytes)) or not isinstance(row_docs, Sequence) or not row_docs:
        raise ValueError(f"row_docs must be a non-empty sequence of rows (document lengths), got {row_docs!r}")
    rows = [_positive_lengths(f"row_docs[{r}]", docs) for r, docs in enumerate(row_docs)]
    width = sum(rows[0])
    for r, docs in enumerate(rows):
        if sum(docs) != width:
            raise ValueError(
                f"row_docs[{r}] holds {sum(docs)} tokens, row 0 holds {width}: packed rows must have one length"
            )
    return torch.stack([torch.cat([torch.arange(n, dtype=torch.int64) for n in docs]) for docs in rows])


def packing_from_position_ids(position_ids: torch.Tensor) -> Packing:
    """``cu_seqlens`` and ``max_seqlen`` of packed rows from their position ids, as transformers derives them.

    ``position_ids``: an integer tensor ``(batch, seqlen)`` or ``(seqlen,)``; each row starts a document (id 0) and
    within a document ids count up by one.  Raises ``ValueError`` naming the argument, the row and the token."""
    if not isinstance(position_ids, torch.Tensor):
        raise ValueError(f"position_ids must be a torch tensor, got {type(position_ids).__name__}")
    if position_ids.dtype.is_floating_point or position_ids.dtype.is_complex or position_ids.dtype == torch.bool:
        raise ValueError(f"position_ids must be an integer tensor, got dtype {position_ids.dtype}")
    ids = position_ids.unsqueeze(0) if position_ids.dim() == 1 else position_ids
    if ids.dim() != 2 or ids.shape[1] == 0 or ids.shape[0] == 0:
        raise ValueError(
            f"position_ids must have shape (batch, seqlen) or (seqlen,) with seqlen > 0, got {tuple(ids.shape)}"
        )
    ids = ids.to(torch.int64).cpu()
    row_docs = []
    for r in range(ids.shape[0]):
        row = ids[r]
        if int(row[0]) != 0:
            raise ValueError(
                f"position_ids: row {r} starts at {int(row[0])}, must start at 0 (rows are flattened: a row that "
                "does not start a document would continue the previous row's last document)"
            )
        step = row[1:] - row[:-1]
        bad = ((row[1:] != 0) & (step != 1)).nonzero()
        if bad.numel():
            t = int(bad[0, 0]) + 1
            raise ValueError(
                f"position_ids: row {r} token {t} is {int(row[t])} after {int(row[t - 1])}: within a document ids "
                "count up by one, and restart at 0 where the next document starts"
            )
        starts = (row == 0).nonzero().flatten().tolist() + [row.numel()]
        row_docs.append(tuple(b - a for a, b in zip(starts[:-1], starts[1:])))
    flat = ids.reshape(-1)
    # transformers: starts where the id is 0 (the first id), then the token count
    cu = torch.cat([(flat == 0).nonzero().flatten().to(torch.int32), torch.tensor([flat.numel()], dtype=torch.int32)])
    doc_lens = tuple(int(n) for n in cu.diff())
    return Packing(cu_seqlens=cu, max_seqlen=max(doc_lens), doc_lens=doc_lens, row_docs=tuple(row_docs))


# ---------------------------------------------------------------------------- unpadding
def unpad_mask(attention_mask: torch.Tensor, padding_side: str = "right") -> Unpadded:
    """``indices``, ``cu_seqlens`` and ``max_seqlen`` of a padded batch's mask, as flash-attn's ``unpad_input``.

    ``attention_mask``: ``(batch, seqlen)``, bool or 0/1 integers, 1 valid; every row holds a valid token, and the
    padding follows ``padding_side`` (``right``: valid tokens first; ``left``: padding first).  Raises ``ValueError``
    naming the argument, the row and the column."""
    if padding_side not in PADDING_SIDES:
        raise ValueError(f"padding_side must be one of {PADDING_SIDES}, got {padding_side!r}")
    if not isinstance(attention_mask, torch.Tensor):
        raise ValueError(f"attention_mask must be a torch tensor, got {type(attention_mask).__name__}")
    if attention_mask.dim() != 2 or 0 in attention_mask.shape:
        raise ValueError(f"attention_mask must have shape (batch, seqlen), both > 0, got {tuple(attention_mask.shape)}")
    if attention_mask.dtype.is_floating_point or attention_mask.dtype.is_complex:
        raise ValueError(f"attention_mask must be bool or 0/1 integers, got dtype {attention_mask.dtype}")
    mask = attention_mask.cpu()
    if mask.dtype != torch.bool:
        odd = ((mask != 0) & (mask != 1)).nonzero()
        if odd.numel():
            r, c = (int(x) for x in odd[0])
            raise ValueError(f"attention_mask must hold 0 or 1, got {int(mask[r, c])} at row {r} column {c}")
        mask = mask.bool()
    batch, seqlen = mask.shape
    seqlens = mask.sum(dim=-1)
    for r in range(batch):
        row = mask[r]
        n = int(seqlens[r])
        if n == 0:
            raise ValueError(f"attention_mask: row {r} holds no valid token (an empty sequence has no softmax)")
        want = torch.zeros(seqlen, dtype=torch.bool)
        if padding_side == "right":
            want[:n] = True
        else:
            want[seqlen - n :] = True
        if not torch.equal(row, want):
            c = int((row != want).nonzero()[0, 0])
            rule = "valid tokens first, then padding" if padding_side == "right" else "padding first, then valid tokens"
            raise ValueError(
                f"attention_mask: row {r} column {c} breaks {padding_side} padding ({rule}); pass the mask's own "
                "padding_side"
            )
    indices = mask.flatten().nonzero().flatten()
    lens = tuple(int(n) for n in seqlens)
    return Unpadded(
        indices=indices,
        cu_seqlens=cu_seqlens_of(lens),
        max_seqlen=max(lens),
        seqlens=lens,
        batch=batch,
        seqlen=seqlen,
        padding_side=padding_side,
    )


def unpad(x: torch.Tensor, u: Unpadded) -> torch.Tensor:
    """``(batch, seqlen, ...)`` -> ``(total, ...)``: the valid tokens, row by row (differentiable)."""
    if x.dim() < 2 or tuple(x.shape[:2]) != (u.batch, u.seqlen):
        raise ValueError(f"x must have shape (batch={u.batch}, seqlen={u.seqlen}, ...), got {tuple(x.shape)}")
    return x.reshape(u.batch * u.seqlen, *x.shape[2:]).index_select(0, u.indices.to(x.device))


def pad(x: torch.Tensor, u: Unpadded) -> torch.Tensor:
    """``(total, ...)`` -> ``(batch, seqlen, ...)`` with zeros at the padding (differentiable)."""
    if x.dim() < 1 or x.shape[0] != u.total:
        raise ValueError(f"x must have shape (total={u.total}, ...), got {tuple(x.shape)}")
    out = x.new_zeros((u.batch * u.seqlen, *x.shape[1:]))
    out = out.index_put((u.indices.to(x.device),), x)
    return out.reshape(u.batch, u.seqlen, *x.shape[1:])


# ---------------------------------------------------------------------------- cases
def training_case(batch: Packing | Unpadded, **fields: Any) -> AttentionCase:
    """The backward case of a training batch: one causal request ``(n, n)`` per document (:class:`Packing`) or per
    row (:class:`Unpadded`), ``backward=True``; ``fields``: the other :class:`AttentionCase` fields (heads, dims,
    window, softcap, sinks, dtype, data, batch_name, ...)."""
    if not isinstance(batch, (Packing, Unpadded)):
        raise ValueError(f"batch must be a Packing or an Unpadded, got {type(batch).__name__}")
    clash = sorted(set(fields) & set(_SET_BY_BATCH))
    if clash:
        raise ValueError(f"{clash[0]}: set by the batch (training_case sets {list(_SET_BY_BATCH)}), do not pass it")
    return AttentionCase(requests=batch.requests, causal=True, backward=True, **fields)


def check_roundtrip(case: AttentionCase, batch: Packing | Unpadded, inputs: Any = None) -> None:
    """Raise ``ValueError`` unless ``case`` is the training call of ``batch``: causal, backward, one ``(n, n)``
    request per document, and (given the case's :class:`~conformance.cases.inputs.CaseInputs`) inputs whose
    ``cu_seqlens_q`` / ``cu_seqlens_k`` are the batch's ``cu_seqlens`` exactly."""
    if not (case.causal and case.backward):
        raise ValueError(
            f"case: a training case is causal and backward, got causal={case.causal}, backward={case.backward}"
        )
    if case.requests != batch.requests:
        raise ValueError(f"case.requests {case.requests} != the batch's {batch.requests}")
    if not torch.equal(cu_seqlens_of([q for q, _ in case.requests]), batch.cu_seqlens.cpu()):
        raise ValueError("case: cumulative request lengths differ from the batch's cu_seqlens")
    if inputs is not None:
        for name in ("cu_seqlens_q", "cu_seqlens_k"):
            got = getattr(inputs, name).cpu()
            if not torch.equal(got.to(torch.int32), batch.cu_seqlens.cpu()):
                raise ValueError(f"inputs.{name} {got.tolist()} != the batch's cu_seqlens {batch.cu_seqlens.tolist()}")


def case_position_ids(case: AttentionCase) -> torch.Tensor:
    """The ``(1, total_q)`` position ids of a self-attention case's requests packed in one row (ids restart at 0 at
    each request): :func:`packing_from_position_ids` of them gives the case's requests back."""
    bad = [r for r in case.requests if r[0] != r[1] or r[0] == 0]
    if bad:
        raise ValueError(f"case.requests must be non-empty self-attention (n, n) pairs, got {bad[0]}")
    return position_ids_for([[q for q, _ in case.requests]])
