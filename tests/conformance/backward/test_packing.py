"""Training-style batches: cu_seqlens from position ids, unpad/pad, the case a batch becomes, and the gradients of a
padded batch run through unpad -> varlen attention -> pad (autograd on a naive fp64 attention, CPU)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.backward.packing import (
    Packing,
    case_position_ids,
    check_roundtrip,
    cu_seqlens_of,
    pad,
    packing_from_position_ids,
    position_ids_for,
    training_case,
    unpad,
    unpad_mask,
)
from conformance.cases.inputs import make_inputs


# ---------------------------------------------------------------------------- position ids -> cu_seqlens
@pytest.mark.parametrize(
    "rows, cu",
    [
        ([[5]], [0, 5]),
        ([[3, 1, 4]], [0, 3, 4, 8]),
        ([[1, 1, 1, 1]], [0, 1, 2, 3, 4]),
        ([[1500, 1200, 900, 496]], [0, 1500, 2700, 3600, 4096]),
        ([[2, 3], [4, 1], [5]], [0, 2, 5, 9, 10, 15]),  # rows flattened: documents in row-major order
    ],
)
def test_cu_seqlens_from_position_ids(rows, cu):
    ids = position_ids_for(rows)
    assert ids.shape == (len(rows), sum(rows[0])) and ids.dtype == torch.int64
    packing = packing_from_position_ids(ids)
    assert packing.cu_seqlens.dtype == torch.int32
    assert packing.cu_seqlens.tolist() == cu
    assert packing.max_seqlen == max(max(r) for r in rows)
    assert packing.row_docs == tuple(tuple(r) for r in rows)
    assert packing.requests == tuple((n, n) for r in rows for n in r)


def test_position_ids_written_out():
    assert position_ids_for([[3, 2]]).tolist() == [[0, 1, 2, 0, 1]]
    # a 1-d row is one row, as transformers' reshape(-1) treats it
    p = packing_from_position_ids(torch.tensor([0, 1, 2, 0, 1, 0]))
    assert p.cu_seqlens.tolist() == [0, 3, 5, 6] and p.max_seqlen == 3


@settings(max_examples=60)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=8), st.integers(1, 3))
def test_packing_roundtrip_property(docs, rows):
    """Any packing: position ids -> cu_seqlens gives the documents back, and a case's position ids its requests."""
    packing = packing_from_position_ids(position_ids_for([docs] * rows))
    assert packing.doc_lens == tuple(docs) * rows
    assert packing.cu_seqlens.tolist() == [0, *torch.tensor(list(docs) * rows).cumsum(0).tolist()]
    case = training_case(packing, num_heads=2, num_kv_heads=1, head_dim=8)
    check_roundtrip(case, packing)
    again = packing_from_position_ids(case_position_ids(case))
    assert torch.equal(again.cu_seqlens, packing.cu_seqlens)


@pytest.mark.parametrize(
    "ids, message",
    [
        (torch.tensor([[1, 2, 3]]), "row 0 starts at 1, must start at 0"),
        (torch.tensor([[0, 1, 2], [3, 4, 5]]), "row 1 starts at 3, must start at 0"),
        (torch.tensor([[0, 1, 3, 0]]), "row 0 token 2 is 3 after 1"),
        (torch.tensor([[0, 1, -1]]), "row 0 token 2 is -1 after 1"),
        (torch.tensor([[0.0, 1.0]]), "position_ids must be an integer tensor"),
        (torch.zeros(1, 0, dtype=torch.long), "position_ids must have shape"),
        (torch.zeros(1, 2, 2, dtype=torch.long), "position_ids must have shape"),
        ([0, 1, 2], "position_ids must be a torch tensor"),
    ],
)
def test_bad_position_ids(ids, message):
    with pytest.raises(ValueError, match="position_ids") as err:
        packing_from_position_ids(ids)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "rows, message",
    [
        ([], "row_docs must be a non-empty sequence"),
        ([[3, 0]], "row_docs[0][1] must be a positive int"),
        ([[3, 2], [4]], "row_docs[1] holds 4 tokens, row 0 holds 5"),
        ([[2.5]], "row_docs[0][0] must be a positive int"),
    ],
)
def test_bad_row_docs(rows, message):
    with pytest.raises(ValueError) as err:
        position_ids_for(rows)
    assert message in str(err.value)


# ---------------------------------------------------------------------------- unpad / pad
def _mask(lens, seqlen, side="right"):
    m = torch.zeros(len(lens), seqlen, dtype=torch.bool)
    for r, n in enumerate(lens):
        if side == "right":
            m[r, :n] = True
        else:
            m[r, seqlen - n :] = True
    return m


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("lens", [(7, 3, 1, 7), (1,), (5, 5)])
def test_unpad_pad_roundtrip_exact(side, lens):
    seqlen = max(lens)
    mask = _mask(lens, seqlen, side)
    u = unpad_mask(mask.to(torch.int64), side)  # 0/1 integers, as tokenizers return it
    assert u.cu_seqlens.tolist() == cu_seqlens_of(lens).tolist() and u.cu_seqlens.dtype == torch.int32
    assert u.max_seqlen == max(lens) and u.seqlens == tuple(lens) and u.total == sum(lens)
    assert torch.equal(u.indices, mask.flatten().nonzero().flatten())  # flash-attn's unpad_input indices
    x = torch.randn(len(lens), seqlen, 3, 4, dtype=torch.bfloat16)
    packed = unpad(x, u)
    assert packed.shape == (sum(lens), 3, 4)
    # row by row, the valid tokens in order
    assert torch.equal(packed[: lens[0]], x[0][mask[0]])
    back = pad(packed, u)
    assert torch.equal(back, x * mask[:, :, None, None])  # bitwise: the valid tokens, zeros at the padding
    assert training_case(u, num_heads=3, num_kv_heads=3, head_dim=4).requests == tuple((n, n) for n in lens)


@pytest.mark.parametrize(
    "mask, side, message",
    [
        (torch.tensor([[1, 0, 1]]), "right", "row 0 column 1 breaks right padding"),
        (torch.tensor([[1, 1, 0]]), "left", "row 0 column 0 breaks left padding"),
        (torch.tensor([[1, 1], [0, 0]]), "right", "row 1 holds no valid token"),
        (torch.tensor([[1, 2]]), "right", "must hold 0 or 1, got 2 at row 0 column 1"),
        (torch.tensor([[1.0, 1.0]]), "right", "must be bool or 0/1 integers"),
        (torch.ones(3, dtype=torch.bool), "right", "must have shape (batch, seqlen)"),
    ],
)
def test_bad_masks(mask, side, message):
    with pytest.raises(ValueError, match="attention_mask") as err:
        unpad_mask(mask, side)
    assert message in str(err.value)


def test_bad_unpad_arguments():
    u = unpad_mask(_mask((2, 1), 2))
    with pytest.raises(ValueError, match="padding_side must be one of"):
        unpad_mask(_mask((2, 1), 2), "middle")
    with pytest.raises(ValueError, match=r"x must have shape \(batch=2, seqlen=2"):
        unpad(torch.zeros(2, 3, 1), u)
    with pytest.raises(ValueError, match=r"x must have shape \(total=3"):
        pad(torch.zeros(4, 1), u)


# ---------------------------------------------------------------------------- cases
def test_training_case_and_inputs_roundtrip():
    packing = packing_from_position_ids(position_ids_for([[5, 9, 2], [10, 6]]))
    case = training_case(packing, num_heads=4, num_kv_heads=2, head_dim=8, window=(3, 0), softcap=30.0)
    assert case.causal and case.backward and case.requests == ((5, 5), (9, 9), (2, 2), (10, 10), (6, 6))
    inputs = make_inputs(case)
    check_roundtrip(case, packing, inputs)  # the harness passes the kernel exactly the framework's cu_seqlens
    inputs.cu_seqlens_k = inputs.cu_seqlens_k.clone()
    inputs.cu_seqlens_k[2] += 1
    with pytest.raises(ValueError, match="inputs.cu_seqlens_k"):
        check_roundtrip(case, packing, inputs)
    other = training_case(packing_from_position_ids(position_ids_for([[5, 9, 2, 10, 6]])), **_dims())
    check_roundtrip(other, packing)  # one row or two: the same documents, the same call
    with pytest.raises(ValueError, match="case.requests"):
        check_roundtrip(training_case(packing_from_position_ids(position_ids_for([[14, 2, 16]])), **_dims()), packing)
    with pytest.raises(ValueError, match="causal and backward"):
        check_roundtrip(case.replace(backward=False), packing)


def _dims():
    return dict(num_heads=4, num_kv_heads=2, head_dim=8)


def test_training_case_refuses():
    packing = packing_from_position_ids(position_ids_for([[3]]))
    with pytest.raises(ValueError, match="causal: set by the batch"):
        training_case(packing, causal=False, **_dims())
    with pytest.raises(ValueError, match="batch must be a Packing or an Unpadded"):
        training_case([[3]], **_dims())
    with pytest.raises(ValueError, match="backward cannot be combined with kv_layout"):
        training_case(packing, kv_layout="NHD", block_size=16, **_dims())  # the case model's own validation
    with pytest.raises(ValueError, match="self-attention"):
        case_position_ids(training_case(packing, **_dims()).replace(requests=((3, 5),)))
    assert isinstance(packing, Packing)


# ---------------------------------------------------------------------------- gradients end to end
def _attend(q, k, v, allowed, scale):
    """Naive attention over (s, h, d) with an (sq, sk) bool mask; rows with no allowed key give 0."""
    hk = k.shape[1]
    rep = q.shape[1] // hk
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    s = s.masked_fill(~allowed, -1e30)  # finite: a fully masked row stays finite (and is masked out below)
    p = torch.softmax(s, dim=-1) * allowed.any(-1, keepdim=True)
    return torch.einsum("hqk,khd->qhd", p, v)


def _padded_attention(q, k, v, mask, scale):
    """(b, s, h, d) attention of a padded batch: causal on absolute positions, padding keys masked."""
    s = q.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    return torch.stack([_attend(q[b], k[b], v[b], causal & mask[b][None, :], scale) for b in range(q.shape[0])])


def _varlen_attention(q, k, v, cu, scale):
    outs = []
    for b in range(cu.numel() - 1):
        lo, hi = int(cu[b]), int(cu[b + 1])
        n = hi - lo
        outs.append(_attend(q[lo:hi], k[lo:hi], v[lo:hi], torch.ones(n, n, dtype=torch.bool).tril(), scale))
    return torch.cat(outs)


@pytest.mark.parametrize("side", ["right", "left"])
def test_gradients_through_unpad_varlen_pad_equal_padded(side):
    """A training step's two spellings: the padded attention with padding masked, and unpad -> varlen -> pad;
    their gradients in q, k, v agree (fp64), and are zero at the padding."""
    torch.manual_seed(0)
    lens, s, h, hk, d = (6, 2, 5), 6, 4, 2, 8
    mask = _mask(lens, s, side)
    scale = 1 / math.sqrt(d)
    q0, k0, v0 = (torch.randn(len(lens), s, n, d, dtype=torch.float64) for n in (h, hk, hk))
    dout = torch.randn(len(lens), s, h, d, dtype=torch.float64)
    m4 = mask[:, :, None, None]

    q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
    (_padded_attention(q, k, v, mask, scale) * dout * m4).sum().backward()
    want = [t.grad for t in (q, k, v)]

    q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
    u = unpad_mask(mask, side)
    out = pad(_varlen_attention(unpad(q, u), unpad(k, u), unpad(v, u), u.cu_seqlens, scale), u)
    assert torch.allclose(out, _padded_attention(q0, k0, v0, mask, scale) * m4, atol=1e-12, rtol=0)
    (out * dout).sum().backward()
    for name, t, w in zip("qkv", (q, k, v), want):
        assert torch.allclose(t.grad, w, atol=1e-12, rtol=0), name
        assert torch.count_nonzero(t.grad * ~m4) == 0, name  # no gradient reaches a padding token
        assert torch.count_nonzero(t.grad * m4) > 0, name


def test_gradients_catch_a_wrong_unpadding():
    """The end-to-end comparison is sharp: unpadding with the other padding side's indices changes the gradients."""
    torch.manual_seed(1)
    lens, s, h, d = (4, 2), 4, 2, 4
    mask = _mask(lens, s, "right")
    q0, k0, v0 = (torch.randn(len(lens), s, h, d, dtype=torch.float64) for _ in range(3))
    dout = torch.randn(len(lens), s, h, d, dtype=torch.float64)
    q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
    (_padded_attention(q, k, v, mask, 0.5) * dout * mask[:, :, None, None]).sum().backward()
    wrong = unpad_mask(_mask(lens, s, "left"), "left")  # the right lengths at the wrong positions
    q2, k2, v2 = (t.clone().requires_grad_() for t in (q0, k0, v0))
    (
        pad(_varlen_attention(unpad(q2, wrong), unpad(k2, wrong), unpad(v2, wrong), wrong.cu_seqlens, 0.5), wrong)
        * dout
    ).sum().backward()
    assert not torch.allclose(q2.grad, q.grad, atol=1e-6)
