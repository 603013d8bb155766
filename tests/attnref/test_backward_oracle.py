"""Checks of the gradient oracles themselves, of their power, and of the backward's memory bound.

* The autograd oracle (grad_oracle.py) passes ``torch.autograd.gradcheck`` (finite differences of the naive
  forward), and the reference backward matches central differences of the reference *forward* in fp64.
* Planted bugs: mutated copies of attnref/backward.py (dK not summed over a GQA group, the soft-cap derivative
  missing, the mask not applied in dS, the LSE of the wrong row reused, the sink gradient's sign) differ from the
  oracle by far more than the tolerance the oracle comparison uses.
* Memory: with a small ``max_tile_elems`` no intermediate tensor is larger than the budget or the inputs/outputs.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
from grad_oracle import naive_attention, oracle_grads_batch
from oracle import options_kwargs
from refhelpers import make_packed
from torch.utils._python_dispatch import TorchDispatchMode

import attnref.backward as backward
from attnref import AttnOptions, Numerics, attention_varlen, attention_varlen_backward

F64 = torch.float64
TOL = 1e-10  # the fp64 oracle comparison's tolerance (test_backward.py)


def _inputs(lens, h, hk, d, dv, seed):
    gen = torch.Generator().manual_seed(seed)
    packed = make_packed(gen, lens, h, hk, d, dv, dtype=F64, q_scale=1.5)
    dout = torch.randn(packed.q.shape[0], h, dv, generator=gen, dtype=F64)
    return packed, dout, torch.rand(h, generator=gen, dtype=F64), torch.randn(h, generator=gen, dtype=F64)


FD_MODES = [
    AttnOptions(causal=True, softcap=1.2),
    AttnOptions(window=(1, 2), chunk=3, scale=0.7),
    AttnOptions(),
]


@pytest.mark.parametrize("options", FD_MODES, ids=["causal_softcap", "window_chunk_scale", "full"])
def test_oracle_passes_gradcheck(options: AttnOptions) -> None:
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(4, 2, 2, generator=gen, dtype=F64), torch.randn(3, 1, 2, generator=gen, dtype=F64)
    v, sinks = torch.randn(3, 1, 3, generator=gen, dtype=F64), torch.randn(2, generator=gen, dtype=F64)
    alibi = torch.rand(2, generator=gen, dtype=F64)
    kwargs = options_kwargs(options)

    def out(q, k, v, sinks):
        return naive_attention(q, k, v, alibi=alibi, sinks=sinks, **kwargs)[0]

    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, sinks)]
    assert torch.autograd.gradcheck(out, leaves, eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("options", FD_MODES, ids=["causal_softcap", "window_chunk_scale", "full"])
def test_backward_matches_central_differences_of_the_forward(options: AttnOptions) -> None:
    packed, dout, alibi, sinks = _inputs([(3, 4), (2, 2), (3, 1)], 2, 1, 2, 3, seed=2)
    numerics = Numerics(F64, 3)
    tensors = {"q": packed.q, "k": packed.k, "v": packed.v, "sinks": sinks}

    def loss(**changed) -> float:
        t = {**tensors, **changed}
        res = attention_varlen(
            t["q"],
            t["k"],
            t["v"],
            packed.cu_q,
            packed.cu_k,
            options=options,
            alibi_slopes=alibi,
            sinks=t["sinks"],
            numerics=numerics,
        )
        return float((res.out * dout).sum())

    grads = attention_varlen_backward(
        packed.q,
        packed.k,
        packed.v,
        dout,
        packed.cu_q,
        packed.cu_k,
        options=options,
        alibi_slopes=alibi,
        sinks=sinks,
        numerics=numerics,
    )
    eps = 1e-6
    for name, grad in zip(("q", "k", "v", "sinks"), grads):
        base = tensors[name]
        fd = torch.zeros_like(base)
        for idx in range(base.numel()):
            up, down = base.clone(), base.clone()
            up.view(-1)[idx] += eps
            down.view(-1)[idx] -= eps
            fd.view(-1)[idx] = (loss(**{name: up}) - loss(**{name: down})) / (2 * eps)
        torch.testing.assert_close(grad, fd, rtol=1e-6, atol=1e-8, msg=lambda m, n=name: f"d{n}: {m}")


# ---- planted bugs: each mutant of attnref/backward.py must be far from the oracle ----

_SOURCE = Path(backward.__file__).read_text()
MUTANTS = {
    "dk_not_summed_over_group": [
        (
            "dk[:, k0:k1] += torch.matmul(ds.transpose(-1, -2), qt) * scale",
            "dk[:, k0:k1] += torch.matmul(ds[:, :n].transpose(-1, -2), qt[:, :n]) * scale",  # first head only
        )
    ],
    "softcap_derivative_missing": [("ds = ds * (1.0 - t * t)", "ds = ds")],
    "mask_not_applied_in_ds": [
        (
            "            if not (bool((lo <= k0)",
            "            s_open = s.reshape(hk, group * n, k1 - k0)\n            if not (bool((lo <= k0)",
        ),
        ("ds = p * (dp - delta_t)", "ds = torch.exp(s_open - lse_t) * (dp - delta_t)"),
    ],
    "lse_of_wrong_row": [("lse_safe[:, :, q0:q1]", "lse_safe.roll(1, dims=-1)[:, :, q0:q1]")],
    "sink_gradient_sign": [("dsinks = -(p_sink * delta)", "dsinks = (p_sink * delta)")],
}


def _mutant(name: str) -> types.ModuleType:
    source = _SOURCE
    for old, new in MUTANTS[name]:
        assert source.count(old) == 1, f"mutant {name}: {old!r} no longer occurs once in attnref/backward.py"
        source = source.replace(old, new)
    module = types.ModuleType(f"attnref._mutant_{name}")
    module.__package__ = "attnref"
    exec(compile(source, f"<mutant {name}>", "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("name", list(MUTANTS))
def test_planted_bug_is_far_from_the_oracle(name: str) -> None:
    # GQA 4/2, causal + soft-cap, sinks, sq > sk in one sequence: every planted bug has something to break
    packed, dout, _, sinks = _inputs([(6, 5), (4, 7)], 4, 2, 3, 5, seed=3)
    options = AttnOptions(causal=True, softcap=1.0)
    kwargs = {
        "options": options,
        "sinks": sinks,
        "numerics": Numerics(F64, 1 << 20),
    }  # one tile: the mask is not all in the skips
    douts = list(dout.split([6, 4]))
    want = oracle_grads_batch(packed.qs, packed.ks, packed.vs, douts, sinks=sinks, **options_kwargs(options))
    args = (packed.q, packed.k, packed.v, dout, packed.cu_q, packed.cu_k)
    good = attention_varlen_backward(*args, **kwargs)
    assert max(float((g - w).abs().max()) for g, w in zip(good, want)) <= TOL
    bad = _mutant(name).attention_varlen_backward(*args, **kwargs)
    worst = max(float((g - w).abs().max()) for g, w in zip(bad, want))
    assert worst > 1e6 * TOL, f"mutant {name} differs from the oracle by only {worst:.3g}"


# ---- memory: bounded by the tile budget ----


class _Largest(TorchDispatchMode):
    """Records the largest tensor any aten op produces."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, _types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for t in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return result


@pytest.mark.parametrize("budget", [16, 64, 200])
def test_score_tiles_stay_within_the_budget(budget: int, monkeypatch: pytest.MonkeyPatch) -> None:
    h, sq, sk, d = 4, 32, 40, 2
    packed, dout, alibi, sinks = _inputs([(sq, sk)], h, 2, d, d, seed=4)
    shapes, original = [], backward.tile_shape

    def recording(sq_, sk_, heads, budget_):
        shape = original(sq_, sk_, heads, budget_)
        shapes.append((heads, *shape))
        return shape

    monkeypatch.setattr(backward, "tile_shape", recording)
    res = attention_varlen(
        packed.q,
        packed.k,
        packed.v,
        packed.cu_q,
        packed.cu_k,
        options=AttnOptions(softcap=2.0),
        alibi_slopes=alibi,
        sinks=sinks,
        numerics=Numerics(F64),
    )
    with _Largest() as mode:
        attention_varlen_backward(
            packed.q,
            packed.k,
            packed.v,
            dout,
            packed.cu_q,
            packed.cu_k,
            options=AttnOptions(softcap=2.0),
            alibi_slopes=alibi,
            sinks=sinks,
            numerics=Numerics(F64, budget),
            out=res.out,
            lse=res.lse,
        )
    assert shapes and all(heads * tq * tk <= max(budget, heads) for heads, tq, tk in shapes), shapes
    io = max(t.numel() for t in (packed.q, packed.k, packed.v, dout))  # the inputs, outputs and their copies
    assert mode.largest <= max(budget, io), (mode.largest, budget, io)
    assert h * sq * sk > 10 * max(budget, io)  # a full score matrix would have broken the bound
