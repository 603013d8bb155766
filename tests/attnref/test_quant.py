"""attnref.quant against an independent numpy oracle written from the formats' definitions.

The oracle imports nothing from attnref: fp8 values are decoded from their bit fields (sign,
exponent with bias, mantissa; e4m3fn has no infinity and one NaN mantissa, e5m2 is IEEE-like) and
rounded in float64 with ``np.rint`` (half to even) on the grid of the binade of the value (the
subnormal step below the smallest normal), after saturation to ``[-max, max]``; int8 is
``np.clip(np.rint(y), -128, 127)``.  ``y = x / scale`` is formed in float32, as the module specifies.
Cache writes are checked against a plain Python loop over tokens and heads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnref import (
    QUANT_FORMATS,
    QuantFormat,
    amax_scale,
    dequantize,
    dequantize_cache,
    expand_descale,
    quant_format,
    quantize,
    quantize_int8_per_token_head,
    write_kv_cache,
    write_kv_cache_fp8,
    write_kv_cache_int8,
)

SETTINGS = settings(max_examples=150)

# ---------------------------------------------------------------------------------------------------
# The oracle (numpy, float64; nothing from attnref)


@dataclass(frozen=True)
class Fp8Spec:
    name: str
    dtype: torch.dtype
    ebits: int
    mbits: int
    bias: int
    ieee: bool  # True: all-ones exponent is inf/NaN (e5m2); False: only S.1111.111 is NaN (e4m3fn)

    @property
    def min_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def sub_step(self) -> float:
        return 2.0 ** (1 - self.bias - self.mbits)

    @property
    def max(self) -> float:
        top_e = (1 << self.ebits) - 2 if self.ieee else (1 << self.ebits) - 1
        top_m = (1 << self.mbits) - 1 if self.ieee else (1 << self.mbits) - 2
        return (1 + top_m / (1 << self.mbits)) * 2.0 ** (top_e - self.bias)


E4M3 = Fp8Spec("fp8_e4m3", torch.float8_e4m3fn, ebits=4, mbits=3, bias=7, ieee=False)
E5M2 = Fp8Spec("fp8_e5m2", torch.float8_e5m2, ebits=5, mbits=2, bias=15, ieee=True)
SPECS = [E4M3, E5M2]


def decode_fp8(code: int, spec: Fp8Spec) -> float:
    """The value of one fp8 byte, from its bit fields."""
    sign = -1.0 if code & 0x80 else 1.0
    e = (code >> spec.mbits) & ((1 << spec.ebits) - 1)
    m = code & ((1 << spec.mbits) - 1)
    all_ones_e = e == (1 << spec.ebits) - 1
    if spec.ieee and all_ones_e:
        return sign * math.inf if m == 0 else math.nan
    if not spec.ieee and all_ones_e and m == (1 << spec.mbits) - 1:
        return math.nan
    if e == 0:
        return sign * m * spec.sub_step
    return sign * (1 + m / (1 << spec.mbits)) * 2.0 ** (e - spec.bias)


def fp8_grid(spec: Fp8Spec) -> np.ndarray:
    """Every finite non-negative fp8 value, ascending."""
    vals = {decode_fp8(c, spec) for c in range(128)}
    return np.array(sorted(v for v in vals if math.isfinite(v)), dtype=np.float64)


def oracle_fp8(y: np.ndarray, spec: Fp8Spec) -> np.ndarray:
    """Saturate to [-max, max], keep NaN, round half to even on the fp8 grid (float64 math)."""
    y = np.asarray(y, dtype=np.float64)
    out = np.full(y.shape, np.nan)
    ok = ~np.isnan(y)
    a = np.minimum(np.abs(y[ok]), spec.max)
    _, e = np.frexp(a)  # a = m * 2**e with m in [0.5, 1): leading bit has weight 2**(e - 1)
    e = np.maximum(e - 1, 1 - spec.bias)  # below the smallest normal the step is the subnormal one
    step = np.ldexp(1.0, e - spec.mbits)
    out[ok] = np.copysign(np.rint(a / step) * step, y[ok])
    return out


def oracle_y(x: torch.Tensor, scale) -> np.ndarray:
    """x / scale in float32 (numpy), as float64."""
    xs = x.detach().to(torch.float32).numpy()
    s = np.asarray(scale.numpy() if isinstance(scale, torch.Tensor) else scale, dtype=np.float32)
    with np.errstate(all="ignore"):
        return (xs / s).astype(np.float64)


def oracle_int8(y: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(y), -128, 127) + 0.0  # + 0.0: int8 has no negative zero


def oracle_absmax_scale(x: np.ndarray, fmax: float, axis=None) -> np.ndarray:
    amax = np.abs(x.astype(np.float32)).max(axis=axis, keepdims=axis is not None)
    scale = (amax / np.float32(fmax)).astype(np.float32)
    return np.where(amax == 0, np.float32(1.0), scale)


def assert_same(got: torch.Tensor, want: np.ndarray) -> None:
    """Equal values, NaN where the oracle has NaN, and the sign of every zero."""
    g = got.to(torch.float64).numpy()
    want = np.asarray(want, dtype=np.float64)
    assert g.shape == want.shape
    bad = ~((g == want) | (np.isnan(g) & np.isnan(want)))
    zeros = (want == 0) & (g == 0)
    bad |= zeros & (np.signbit(g) != np.signbit(want))
    if bad.any():
        idx = np.argwhere(bad)[:5]
        raise AssertionError(
            f"{int(bad.sum())} mismatches, e.g. at {idx.tolist()}: got {g[bad][:5]}, want {want[bad][:5]}"
        )


# ---------------------------------------------------------------------------------------------------
# The oracle and torch agree on what the formats are


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_fp8_code_table_matches_definition(spec):
    codes = torch.arange(256, dtype=torch.uint8).view(spec.dtype)
    assert_same(codes.to(torch.float64), np.array([decode_fp8(c, spec) for c in range(256)]))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_formats_table(spec):
    fmt = QUANT_FORMATS[spec.name]
    assert fmt == QuantFormat(spec.name, spec.dtype, spec.max)
    assert fmt.max == fp8_grid(spec)[-1] == {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}[spec.name]
    assert quant_format(spec.name) is fmt and quant_format(spec.dtype) is fmt
    assert QUANT_FORMATS["int8"] == QuantFormat("int8", torch.int8, 127.0)
    assert quant_format(torch.int8) is QUANT_FORMATS["int8"]
    assert set(QUANT_FORMATS) == {"fp8_e4m3", "fp8_e5m2", "int8"}


# ---------------------------------------------------------------------------------------------------
# quantize against the oracle


def _special_values(spec: Fp8Spec) -> np.ndarray:
    grid = fp8_grid(spec)
    mids = (grid[:-1] + grid[1:]) / 2  # exact ties between neighbours
    top_step = grid[-1] - grid[-2]
    subs = np.arange(0, 2 * (1 << spec.mbits) + 3) * (spec.sub_step / 2)  # subnormal ties and values
    mx = np.float32(spec.max)
    edge = [
        np.nextafter(mx, np.float32(np.inf)),
        np.nextafter(mx, np.float32(0)),
        spec.max + top_step / 2,  # the tie with the next (absent) grid point: saturates
        spec.max + top_step,
        spec.max * 1.001,
        spec.max * 0.999,
        spec.max * 4,
        1e30,
        spec.min_normal,
        np.nextafter(np.float32(spec.min_normal), np.float32(0)),
        spec.sub_step / 4,
        1e-30,
    ]
    pos = np.concatenate([grid, mids, subs, np.array(edge, dtype=np.float64)])
    return np.concatenate([pos, -pos, [np.inf, -np.inf, np.nan, 0.0, -0.0]]).astype(np.float32)


@pytest.mark.parametrize("scale", [1.0, 0.25, 8.0], ids=lambda s: f"s{s}")
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_fp8_special_values(spec, scale):
    # scales are powers of two, so x = value * scale keeps every tie exact
    x = torch.from_numpy(_special_values(spec) * np.float32(scale))
    got = quantize(x, scale, spec.name)
    assert got.dtype == spec.dtype and got.shape == x.shape
    assert_same(got, oracle_fp8(oracle_y(x, scale), spec))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_fp8_ties_go_to_even_code(spec):
    """From the definition directly: a value halfway between two neighbours gets the even code."""
    grid = fp8_grid(spec)
    mids = torch.from_numpy(((grid[:-1] + grid[1:]) / 2).astype(np.float32))
    codes = quantize(mids, 1.0, spec.name).view(torch.uint8).to(torch.int64)
    assert bool((codes % 2 == 0).all())
    lo = torch.from_numpy(grid[:-1]).to(torch.float64)
    hi = torch.from_numpy(grid[1:]).to(torch.float64)
    got = quantize(mids, 1.0, spec.name).to(torch.float64)
    assert bool(((got == lo) | (got == hi)).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", [1.0, 0.37, 3.5, 1e-3, 117.0])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_fp8_random_binades(spec, scale, dtype):
    rng = np.random.default_rng(7)
    mag = 2.0 ** rng.uniform(-30, 20, size=4000)
    x = torch.from_numpy((mag * rng.choice([-1.0, 1.0], size=mag.size)).astype(np.float32)).to(dtype)
    x = x.reshape(40, 10, 10)
    assert_same(quantize(x, scale, spec.name), oracle_fp8(oracle_y(x, scale), spec))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_fp8_broadcast_scale_tensor(spec):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 3, 16, generator=g) * 100
    scale = torch.rand(6, 3, 1, generator=g) + 0.05
    assert_same(quantize(x, scale, spec.name), oracle_fp8(oracle_y(x, scale), spec))
    # fp64 scales are used as fp32 (the spec's fp32 math)
    assert_same(quantize(x, scale.double(), spec.name), oracle_fp8(oracle_y(x, scale), spec))


@SETTINGS
@given(
    values=st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=48),
    scale=st.floats(min_value=2.0**-20, max_value=2.0**20, width=32),
    name=st.sampled_from(["fp8_e4m3", "fp8_e5m2"]),
)
def test_fp8_hypothesis(values, scale, name):
    spec = {s.name: s for s in SPECS}[name]
    x = torch.tensor(values, dtype=torch.float32)
    assert_same(quantize(x, scale, name), oracle_fp8(oracle_y(x, scale), spec))


@pytest.mark.parametrize("scale", [1.0, 0.5, 0.013, 4.0])
def test_int8_against_oracle(scale):
    rng = np.random.default_rng(3)
    ties = np.arange(-140, 141) + 0.5  # every half-integer in range and beyond
    rand = rng.normal(scale=80, size=2000)  # many beyond +-127 once divided by the small scales
    extra = np.array([0.0, -0.0, 126.5, 127.49, 127.5, 128.0, -127.5, -128.5, -129.0, 1e20, -1e20])
    x = torch.from_numpy(np.concatenate([ties * scale, rand, extra * scale]).astype(np.float32))
    got = quantize(x, scale, "int8")
    assert got.dtype == torch.int8
    assert np.array_equal(got.numpy().astype(np.float64), oracle_int8(oracle_y(x, scale)))


@SETTINGS
@given(
    values=st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=48),
    scale=st.floats(min_value=2.0**-20, max_value=2.0**20, width=32),
)
def test_int8_hypothesis(values, scale):
    x = torch.tensor(values, dtype=torch.float32)
    got = quantize(x, scale, "int8").numpy().astype(np.float64)
    assert np.array_equal(got, oracle_int8(oracle_y(x, scale)))


# ---------------------------------------------------------------------------------------------------
# dequantize, amax_scale, per-token-head int8


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2", "int8"])
def test_round_trip_error_bound(name):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 4, 32, generator=g) * torch.logspace(-3, 3, 32)
    scale = amax_scale(x, name)
    back = dequantize(quantize(x, scale, name), scale)
    assert back.dtype == torch.float32
    err = (back.double() - x.double()).abs()
    s = float(scale)
    if name == "int8":
        bound = torch.full_like(err, s / 2)
    else:
        spec = {sp.name: sp for sp in SPECS}[name]
        # half an ulp: relative 2^-(m+1) for normals, absolute half the subnormal step below
        bound = torch.maximum(x.double().abs() * 2.0 ** -(spec.mbits + 1), torch.tensor(spec.sub_step / 2 * s))
    assert bool((err <= bound * (1 + 2.0**-12)).all())


def test_dequantize_exact_and_dtypes():
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    scale = torch.tensor(0.0371)
    want = (codes.float().numpy() * np.float32(0.0371)).astype(np.float64)
    assert_same(dequantize(codes, scale), want)
    assert_same(dequantize(codes, 0.0371), want)
    assert dequantize(codes, scale, torch.bfloat16).dtype == torch.bfloat16
    assert_same(dequantize(codes, scale, torch.bfloat16), torch.from_numpy(want).float().bfloat16().double().numpy())
    q = torch.arange(-128, 128, dtype=torch.int8).reshape(16, 16)
    s = torch.rand(16, 1) + 0.1
    assert_same(dequantize(q, s), (q.numpy().astype(np.float32) * s.numpy()).astype(np.float64))
    assert dequantize(q, s, torch.float64).dtype == torch.float64


@pytest.mark.parametrize("dims", [None, 0, -1, (0, 2), (1,)])
@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2", "int8"])
def test_amax_scale(name, dims):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(5, 3, 7, generator=g) * 10
    x[1] = 0.0  # a zero slab: scale 1 where every reduced value is 0
    x[:, 2] = 0.0
    got = amax_scale(x, name, dims)
    want = oracle_absmax_scale(x.numpy(), QUANT_FORMATS[name].max, dims)
    assert got.dtype == torch.float32 and tuple(got.shape) == want.shape
    assert np.array_equal(got.numpy(), want)


def test_amax_scale_all_zero_and_empty():
    assert float(amax_scale(torch.zeros(4, 4), "fp8_e4m3")) == 1.0
    assert amax_scale(torch.zeros(0, 3), "int8").shape == ()
    assert tuple(amax_scale(torch.zeros(0, 3), "int8", dims=0).shape) == (1, 3)
    assert float(amax_scale(torch.tensor([-448.0, 3.0]), "fp8_e4m3")) == 1.0
    assert float(amax_scale(torch.tensor([-254.0], dtype=torch.bfloat16), "int8")) == 2.0


def test_int8_per_token_head():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(9, 3, 16, generator=g) * torch.logspace(-2, 2, 9)[:, None, None]
    x[4, 1] = 0.0
    x[5, 2, 3] = -1e4  # an outlier dominating its row
    q, s = quantize_int8_per_token_head(x)
    assert q.dtype == torch.int8 and q.shape == x.shape and s.dtype == torch.float32 and s.shape == (9, 3)
    want_s = oracle_absmax_scale(x.numpy(), 127.0, axis=-1)[..., 0]
    assert np.array_equal(s.numpy(), want_s)
    assert float(s[4, 1]) == 1.0
    want_q = oracle_int8(oracle_y(x, torch.from_numpy(want_s)[..., None]))
    assert np.array_equal(q.numpy().astype(np.float64), want_q)
    assert int(q.abs().max()) <= 127 and bool((q.abs().amax(-1)[s != 1.0] == 127).all())


# ---------------------------------------------------------------------------------------------------
# expand_descale


@pytest.mark.parametrize("shape", [(), (1,), (1, 1)])
def test_expand_descale_per_tensor_is_a_view(shape):
    s = torch.full(shape, 0.5)
    e = expand_descale(s, 3, 2)
    assert tuple(e.shape) == (3, 2) and e.stride() == (0, 0)
    assert e.untyped_storage().data_ptr() == s.untyped_storage().data_ptr()
    s.fill_(0.25)
    assert bool((e == 0.25).all())


def test_expand_descale_full_shape_returned_as_is():
    s = torch.rand(3, 2)
    assert expand_descale(s, 3, 2) is s
    one = torch.rand(1, 1)
    assert expand_descale(one, 1, 1) is one


# ---------------------------------------------------------------------------------------------------
# cache writes against a plain loop


def _slots(n: int, capacity: int, rng: np.random.Generator, pad: int) -> list[int]:
    """n token slots: distinct, permuted, with ``pad`` of them -1."""
    chosen = rng.permutation(capacity)[: n - pad].tolist()
    for _ in range(pad):
        chosen.insert(int(rng.integers(0, len(chosen) + 1)), -1)
    return chosen


def _cache_index(layout: str, blk: int, off: int, h: int) -> tuple[int, int, int]:
    return (blk, off, h) if layout == "NHD" else (blk, h, off)


def _cache_shape(layout: str, nb: int, bs: int, hk: int, d: int) -> tuple[int, int, int, int]:
    return (nb, bs, hk, d) if layout == "NHD" else (nb, hk, bs, d)


def _garbage_fp8(shape, dtype, g) -> torch.Tensor:
    return (torch.randn(shape, generator=g) * 3).to(dtype)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("block_size", [1, 3, 16])
@pytest.mark.parametrize(
    ("kname", "vname"), [("fp8_e4m3", "fp8_e4m3"), ("fp8_e5m2", "fp8_e5m2"), ("fp8_e4m3", "fp8_e5m2")]
)
def test_write_kv_cache_fp8(layout, block_size, kname, vname):
    kspec, vspec = ({s.name: s for s in SPECS}[n] for n in (kname, vname))
    rng = np.random.default_rng(block_size)
    g = torch.Generator().manual_seed(block_size)
    hk, d, dv, n = 2, 8, 4, 9
    nb = n // block_size + 2
    key = torch.randn(n, hk, d, generator=g) * 50
    key[0, 0, 0] = 1e6  # saturates
    value = torch.randn(n, hk, dv, generator=g).to(torch.bfloat16)
    k_cache = _garbage_fp8(_cache_shape(layout, nb, block_size, hk, d), kspec.dtype, g)
    v_cache = _garbage_fp8(_cache_shape(layout, nb, block_size, hk, dv), vspec.dtype, g)
    want_k, want_v = k_cache.double().numpy().copy(), v_cache.double().numpy().copy()
    slots = _slots(n, nb * block_size, rng, pad=2)
    k_scale, v_scale = torch.tensor(0.3), torch.tensor([0.02])
    for t, s in enumerate(slots):
        if s < 0:
            continue
        blk, off = divmod(s, block_size)
        for h in range(hk):
            idx = _cache_index(layout, blk, off, h)
            want_k[idx] = oracle_fp8(oracle_y(key[t, h], k_scale), kspec)
            want_v[idx] = oracle_fp8(oracle_y(value[t, h], v_scale), vspec)
    write_kv_cache_fp8(
        key,
        value,
        k_cache,
        v_cache,
        torch.tensor(slots, dtype=torch.long),
        k_scale=k_scale,
        v_scale=v_scale,
        layout=layout,
    )
    assert_same(k_cache, want_k)  # written slots equal the oracle, the rest is untouched
    assert_same(v_cache, want_v)
    # dequantize_cache: the fp32 product of each stored value and the per-tensor scale
    assert_same(dequantize_cache(k_cache, k_scale, layout), (want_k.astype(np.float32) * np.float32(0.3)))
    assert_same(dequantize_cache(v_cache, v_scale, layout), (want_v.astype(np.float32) * np.float32(0.02)))
    assert_same(dequantize_cache(v_cache, 0.02, layout), (want_v.astype(np.float32) * np.float32(0.02)))


def test_write_kv_cache_fp8_stacked_and_all_padding():
    g = torch.Generator().manual_seed(0)
    kv = _garbage_fp8((2, 3, 4, 2, 8), torch.float8_e4m3fn, g)
    before = kv.clone()
    key, value = torch.randn(3, 2, 8, generator=g), torch.randn(3, 2, 8, generator=g)
    one = torch.tensor(1.0)
    write_kv_cache_fp8(key, value, kv, None, torch.tensor([-1, -1, -1]), k_scale=one, v_scale=one)
    assert torch.equal(before.view(torch.uint8), kv.view(torch.uint8))
    write_kv_cache_fp8(key, value, kv, None, torch.tensor([5, -1, 0]), k_scale=one, v_scale=one)
    assert_same(kv[0, 1, 1], oracle_fp8(oracle_y(key[0], 1.0), E4M3))
    assert_same(kv[1, 0, 0], oracle_fp8(oracle_y(value[2], 1.0), E4M3))


def _int8_write_case(layout, block_size, n, pad, vtype, seed):
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    hk, d, dv = 3, 8, 6
    nb = -(-n // block_size) + 1
    key = torch.randn(n, hk, d, generator=g) * torch.logspace(-2, 2, hk)[:, None]
    if n > 1:
        key[1, 0] = 0.0  # an all-zero row: scale 1
    value = torch.randn(n, hk, dv, generator=g) * 5
    slots = _slots(n, nb * block_size, rng, pad=pad)
    for t, s in enumerate(slots):
        if s < 0:
            key[t] = float("nan")  # padding may hold anything; it is never read
    k_cache = torch.randint(-128, 128, _cache_shape(layout, nb, block_size, hk, d), generator=g, dtype=torch.int8)
    k_scale_cache = torch.rand(nb, hk, block_size, generator=g) + 7.0
    if vtype == "int8":
        v_cache = torch.randint(-128, 128, _cache_shape(layout, nb, block_size, hk, dv), generator=g, dtype=torch.int8)
        v_scale = torch.rand(hk, dv, generator=g) * 0.05 + 0.01  # small: many values saturate
    else:
        v_cache = torch.randn(_cache_shape(layout, nb, block_size, hk, dv), generator=g).to(vtype)
        v_scale = None
    return key, value, k_cache, v_cache, k_scale_cache, slots, v_scale


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("block_size", [1, 3, 16])
@pytest.mark.parametrize("vtype", ["int8", torch.float16, torch.bfloat16], ids=["type1", "type2_fp16", "type2_bf16"])
def test_write_kv_cache_int8(layout, block_size, vtype):
    key, value, k_cache, v_cache, ksc, slots, v_scale = _int8_write_case(layout, block_size, 10, 3, vtype, block_size)
    _check_int8_write(key, value, k_cache, v_cache, ksc, slots, v_scale, layout)


def _check_int8_write(key, value, k_cache, v_cache, ksc, slots, v_scale, layout):
    block_size = ksc.shape[2]
    hk = key.shape[1]
    want_k, want_ks = k_cache.numpy().astype(np.float64), ksc.numpy().copy()
    want_v = v_cache.double().numpy().copy()
    for t, s in enumerate(slots):
        if s < 0:
            continue
        blk, off = divmod(s, block_size)
        for h in range(hk):
            idx = _cache_index(layout, blk, off, h)
            row = key[t, h].numpy()
            sc = oracle_absmax_scale(row, 127.0)
            want_ks[blk, h, off] = sc
            want_k[idx] = oracle_int8(oracle_y(key[t, h], float(sc)))
            if v_scale is None:
                want_v[idx] = value[t, h].to(v_cache.dtype).double().numpy()
            else:
                want_v[idx] = oracle_int8(oracle_y(value[t, h], v_scale[h]))
    write_kv_cache_int8(
        key, value, k_cache, v_cache, ksc, torch.tensor(slots, dtype=torch.long), v_scale=v_scale, layout=layout
    )
    assert_same(k_cache, want_k)
    assert np.array_equal(ksc.numpy(), want_ks)
    assert_same(v_cache, want_v)
    # dequantize_cache: per-slot K scales (respecting the layout) and per-channel V scales
    kd = np.empty_like(want_k)
    for blk in range(want_k.shape[0]):
        for off in range(block_size):
            for h in range(hk):
                idx = _cache_index(layout, blk, off, h)
                kd[idx] = (want_k[idx].astype(np.float32) * want_ks[blk, h, off]).astype(np.float64)
    assert_same(dequantize_cache(k_cache, ksc, layout), kd)
    if v_scale is not None:
        vs = v_scale.numpy()
        vs_b = vs[None, None] if layout == "NHD" else vs[None, :, None]
        assert_same(dequantize_cache(v_cache, v_scale, layout), (want_v.astype(np.float32) * vs_b).astype(np.float64))


@SETTINGS
@given(
    layout=st.sampled_from(["NHD", "HND"]),
    block_size=st.integers(1, 5),
    n=st.integers(0, 12),
    pad=st.integers(0, 3),
    vtype=st.sampled_from(["int8", torch.float16, torch.float32]),
    seed=st.integers(0, 2**16),
)
def test_write_kv_cache_int8_hypothesis(layout, block_size, n, pad, vtype, seed):
    pad = min(pad, n)
    key, value, k_cache, v_cache, ksc, slots, v_scale = _int8_write_case(layout, block_size, n, pad, vtype, seed)
    _check_int8_write(key, value, k_cache, v_cache, ksc, slots, v_scale, layout)


# ---------------------------------------------------------------------------------------------------
# ValueError messages name the argument


def _x():
    return torch.randn(2, 4)


def _expect(fn, match):
    with pytest.raises(ValueError, match=match):
        fn()


BAD_CALLS = {
    "fmt_name": (lambda: quant_format("fp4"), r"^fmt must be one of \['fp8_e4m3'"),
    "fmt_dtype": (lambda: quant_format(torch.float16), r"^fmt must be one of"),
    "fmt_in_quantize": (lambda: quantize(_x(), 1.0, "e4m3"), r"^fmt must be one of"),
    "scale_zero": (lambda: quantize(_x(), 0.0, "fp8_e4m3"), r"^scale must be positive and finite"),
    "scale_negative": (lambda: quantize(_x(), -2, "int8"), r"^scale must be positive and finite"),
    "scale_inf": (lambda: quantize(_x(), math.inf, "fp8_e5m2"), r"^scale must be positive and finite"),
    "scale_nan": (lambda: quantize(_x(), torch.tensor(math.nan), "fp8_e5m2"), r"^scale must be positive and finite"),
    "scale_one_zero": (
        lambda: quantize(_x(), torch.tensor([[1.0], [0.0]]), "int8"),
        r"^scale must be positive and finite",
    ),
    "scale_fp32_overflow": (lambda: quantize(_x(), torch.tensor(1e300).double(), "int8"), r"^scale must be positive"),
    "scale_int": (lambda: quantize(_x(), torch.tensor(2), "int8"), r"^scale must be a floating tensor"),
    "scale_bool": (lambda: quantize(_x(), True, "int8"), r"^scale must be a float tensor or number"),
    "scale_shape": (lambda: quantize(_x(), torch.ones(3), "int8"), r"^scale of shape \(3,\) must broadcast"),
    "scale_grows_x": (lambda: quantize(_x(), torch.ones(3, 2, 4), "int8"), r"^scale of shape \(3, 2, 4\)"),
    "x_int": (lambda: quantize(torch.ones(3, dtype=torch.int32), 1.0, "fp8_e4m3"), r"^x must be a floating tensor"),
    "x_not_tensor": (lambda: quantize([1.0], 1.0, "fp8_e4m3"), r"^x must be a torch.Tensor"),
    "x_nan_int8": (lambda: quantize(torch.tensor([1.0, math.nan]), 1.0, "int8"), r"^x must be finite"),
    "x_inf_int8": (lambda: quantize(torch.tensor([-math.inf]), 1.0, "int8"), r"^x must be finite"),
    "dequantize_dtype": (lambda: dequantize(torch.ones(2, dtype=torch.int8), 1.0, torch.int8), r"^dtype must"),
    "dequantize_xq": (lambda: dequantize(torch.ones(2, dtype=torch.bool), 1.0), r"^xq must"),
    "dequantize_scale": (lambda: dequantize(torch.ones(2, 3, dtype=torch.int8), torch.ones(2)), r"^scale of shape"),
    "amax_dims_range": (lambda: amax_scale(_x(), "int8", 2), r"^dims entries must lie in \[-2, 2\)"),
    "amax_dims_repeat": (lambda: amax_scale(_x(), "int8", (0, -2)), r"^dims must not repeat"),
    "amax_dims_empty": (lambda: amax_scale(_x(), "int8", ()), r"^dims must be None, an int"),
    "amax_x_nan": (lambda: amax_scale(torch.tensor([math.nan]), "int8"), r"^x must be finite"),
    "amax_fmt": (lambda: amax_scale(_x(), "fp16"), r"^fmt must be one of"),
    "per_token_head_rank": (lambda: quantize_int8_per_token_head(_x()), r"^x must have 3 dims"),
    "per_token_head_nan": (
        lambda: quantize_int8_per_token_head(torch.full((1, 1, 2), math.nan)),
        r"^x must be finite",
    ),
    "descale_shape": (
        lambda: expand_descale(torch.ones(2), 3, 2),
        r"^descale must be per-tensor \(shape \(\), \(1,\) or \(1, 1\)\) or per \(batch, kv_head\) \(3, 2\)",
    ),
    "descale_transposed": (lambda: expand_descale(torch.ones(2, 3), 3, 2), r"^descale must be per-tensor"),
    "descale_named": (lambda: expand_descale(torch.ones(4), 3, 2, name="k_descale"), r"^k_descale must be per-tensor"),
    "descale_int": (lambda: expand_descale(torch.ones((), dtype=torch.int32), 3, 2), r"^descale must be a floating"),
    "descale_not_tensor": (lambda: expand_descale(1.0, 3, 2, name="v_descale"), r"^v_descale must be a torch.Tensor"),
    "descale_batch": (lambda: expand_descale(torch.ones(()), -1, 2), r"^batch must be an int >= 0"),
    "descale_heads": (lambda: expand_descale(torch.ones(()), 3, 0), r"^num_kv_heads must be an int >= 1"),
    "dequantize_cache_scale_shape": (
        lambda: dequantize_cache(torch.zeros(2, 4, 3, 8, dtype=torch.int8), torch.ones(2, 4, 3)),
        r"^scale must be per-tensor \(shape \(\) or \(1,\)\), a K scale cache .* = \(2, 3, 4\) .* = \(3, 8\)",
    ),
    "dequantize_cache_hnd_scale": (
        lambda: dequantize_cache(torch.zeros(2, 4, 3, 8, dtype=torch.int8), torch.ones(2, 3, 4), "HND"),
        r"^scale must be per-tensor",
    ),
    "dequantize_cache_scale_int": (
        lambda: dequantize_cache(torch.zeros(2, 4, 3, 8, dtype=torch.int8), torch.ones(3, 8, dtype=torch.int32)),
        r"^scale must be a floating",
    ),
    "dequantize_cache_rank": (lambda: dequantize_cache(torch.zeros(4, 3, 8), 1.0), r"^cache must be 4-D"),
    "dequantize_cache_layout": (
        lambda: dequantize_cache(torch.zeros(2, 4, 3, 8, dtype=torch.int8), 1.0, "BHSD"),
        r"^layout must be 'NHD' or 'HND'",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CALLS), ids=list(BAD_CALLS))
def test_value_errors(case):
    fn, match = BAD_CALLS[case]
    _expect(fn, match)


# cache-write argument breaks: name -> (overrides, match)
NB, BS, HK, D, DV, N = 3, 4, 2, 8, 6, 5


def _fp8_args(**over):
    args = {
        "key": torch.randn(N, HK, D),
        "value": torch.randn(N, HK, DV),
        "k_cache": torch.zeros(NB, BS, HK, D, dtype=torch.float8_e4m3fn),
        "v_cache": torch.zeros(NB, BS, HK, DV, dtype=torch.float8_e5m2),
        "slot_mapping": torch.tensor([0, 5, -1, 11, 2]),
        "k_scale": torch.tensor(0.5),
        "v_scale": torch.tensor([0.25]),
    }
    args.update(over)
    return args


def _int8_args(**over):
    args = {
        "key": torch.randn(N, HK, D),
        "value": torch.randn(N, HK, DV),
        "k_cache": torch.zeros(NB, BS, HK, D, dtype=torch.int8),
        "v_cache": torch.zeros(NB, BS, HK, DV, dtype=torch.int8),
        "k_scale_cache": torch.zeros(NB, HK, BS),
        "slot_mapping": torch.tensor([0, 5, -1, 11, 2]),
        "v_scale": torch.full((HK, DV), 0.1),
    }
    args.update(over)
    return args


# breaks shared with attnref.paged.write_kv_cache: the messages must be the same
SHARED_BREAKS = {
    "key_shape": ({"key": torch.randn(N, HK, D + 1)}, r"^key must have shape \(n, 2, 8\) to match k_cache"),
    "key_rank": ({"key": torch.randn(N, HK * D)}, r"^key must have shape"),
    "value_shape": ({"value": torch.randn(N, HK + 1, DV)}, r"^value must have shape \(n, 2, 6\) to match v_cache"),
    "token_count": ({"slot_mapping": torch.tensor([0, 1, 2])}, r"^slot_mapping \(3\), key \(5\) and value \(5\)"),
    "value_count": ({"value": torch.randn(N + 1, HK, DV)}, r"^slot_mapping \(5\), key \(5\) and value \(6\)"),
    "slot_high": ({"slot_mapping": torch.tensor([0, 12, -1, 3, 2])}, r"^slot_mapping\[1\] = 12 is outside the cache"),
    "slot_low": ({"slot_mapping": torch.tensor([0, 1, -2, 3, 2])}, r"^slot_mapping\[2\] = -2 is outside the cache"),
    "slot_float": ({"slot_mapping": torch.tensor([0.0, 1, 2, 3, 4])}, r"^slot_mapping must be an integer tensor"),
    "slot_2d": ({"slot_mapping": torch.zeros(5, 1, dtype=torch.long)}, r"^slot_mapping must be 1-D"),
    "layout": ({"layout": "NDH"}, r"^layout must be 'NHD' or 'HND'"),
}


def _paged_message(over: dict) -> str:
    args = _fp8_args(**over)
    k_cache = torch.zeros(args["k_cache"].shape)
    v_cache = torch.zeros(args["v_cache"].shape)
    with pytest.raises(ValueError) as info:
        write_kv_cache(
            args["key"], args["value"], k_cache, v_cache, args["slot_mapping"], layout=args.get("layout", "NHD")
        )
    return str(info.value)


@pytest.mark.parametrize("case", list(SHARED_BREAKS), ids=list(SHARED_BREAKS))
@pytest.mark.parametrize("writer", ["fp8", "int8"])
def test_cache_write_shared_errors(case, writer):
    over, match = SHARED_BREAKS[case]
    if writer == "fp8":
        args = _fp8_args(**over)
        before = [args["k_cache"].clone(), args["v_cache"].clone()]
        fn = lambda: write_kv_cache_fp8(**args)
    else:
        args = _int8_args(**over)
        before = [args["k_cache"].clone(), args["v_cache"].clone(), args["k_scale_cache"].clone()]
        fn = lambda: write_kv_cache_int8(**args)
    with pytest.raises(ValueError, match=match) as info:
        fn()
    assert str(info.value) == _paged_message(over)
    after = [args["k_cache"], args["v_cache"]] + ([args["k_scale_cache"]] if writer == "int8" else [])
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(before, after))


FP8_BREAKS = {
    "k_cache_dtype": ({"k_cache": torch.zeros(NB, BS, HK, D, dtype=torch.float16)}, r"^k_cache must have an fp8 dtype"),
    "k_cache_int8": ({"k_cache": torch.zeros(NB, BS, HK, D, dtype=torch.int8)}, r"^k_cache must have an fp8 dtype"),
    "v_cache_dtype": ({"v_cache": torch.zeros(NB, BS, HK, DV)}, r"^v_cache must have an fp8 dtype"),
    "k_scale_shape": ({"k_scale": torch.ones(2)}, r"^k_scale must be a per-tensor fp32 tensor of shape \(\) or \(1,\)"),
    "k_scale_dtype": ({"k_scale": torch.ones((), dtype=torch.float64)}, r"^k_scale must be a per-tensor fp32"),
    "v_scale_number": (
        {"v_scale": 0.5},
        r"^v_scale must be a per-tensor fp32 tensor of shape \(\) or \(1,\), got float",
    ),
    "v_scale_per_head": ({"v_scale": torch.ones(1, HK)}, r"^v_scale must be a per-tensor"),
    "k_scale_zero": ({"k_scale": torch.tensor(0.0)}, r"^k_scale must be positive and finite"),
    "v_scale_nan": ({"v_scale": torch.tensor([math.nan])}, r"^v_scale must be positive and finite"),
    "key_int": ({"key": torch.ones(N, HK, D, dtype=torch.int32)}, r"^key must be a floating tensor"),
    "value_int": ({"value": torch.ones(N, HK, DV, dtype=torch.int64)}, r"^value must be a floating tensor"),
    "stacked_shape": ({"k_cache": torch.zeros(3, NB, BS, HK, D), "v_cache": None}, r"^a stacked kv cache must"),
}


@pytest.mark.parametrize("case", list(FP8_BREAKS), ids=list(FP8_BREAKS))
def test_fp8_write_errors(case):
    write_kv_cache_fp8(**_fp8_args())  # the base call is valid
    over, match = FP8_BREAKS[case]
    _expect(lambda: write_kv_cache_fp8(**_fp8_args(**over)), match)


INT8_BREAKS = {
    "k_cache_dtype": ({"k_cache": torch.zeros(NB, BS, HK, D)}, r"^k_cache must be an int8 tensor"),
    "k_cache_fp8": (
        {"k_cache": torch.zeros(NB, BS, HK, D, dtype=torch.float8_e4m3fn)},
        r"^k_cache must be an int8 tensor",
    ),
    "v_cache_float_with_scale": ({"v_cache": torch.zeros(NB, BS, HK, DV)}, r"^v_cache must be int8 when v_scale"),
    "v_cache_int8_without_scale": ({"v_scale": None}, r"^v_cache must be an fp16/bf16/fp32 cache when v_scale is None"),
    "v_cache_fp8_without_scale": (
        {"v_scale": None, "v_cache": torch.zeros(NB, BS, HK, DV, dtype=torch.float8_e4m3fn)},
        r"^v_cache must be an fp16/bf16/fp32",
    ),
    "k_scale_cache_nhd_order": (
        {"k_scale_cache": torch.zeros(NB, BS, HK)},
        r"^k_scale_cache must be fp32 of shape \(num_blocks, hk, block_size\) = \(3, 2, 4\), got shape \(3, 4, 2\)",
    ),
    "k_scale_cache_dtype": ({"k_scale_cache": torch.zeros(NB, HK, BS, dtype=torch.float16)}, r"^k_scale_cache must be"),
    "k_scale_cache_missing": ({"k_scale_cache": None}, r"^k_scale_cache must be fp32 of shape .* got NoneType"),
    "v_scale_shape": ({"v_scale": torch.ones(HK)}, r"^v_scale must be fp32 of shape \(hk, dv\) = \(2, 6\)"),
    "v_scale_dtype": ({"v_scale": torch.ones(HK, DV, dtype=torch.float64)}, r"^v_scale must be fp32 of shape"),
    "v_scale_zero": ({"v_scale": torch.zeros(HK, DV)}, r"^v_scale must be positive and finite"),
    "key_nan": ({"key": torch.full((N, HK, D), math.nan)}, r"^key must be finite"),
    "key_int": ({"key": torch.ones(N, HK, D, dtype=torch.int32)}, r"^key must be a floating tensor"),
    "value_inf": ({"value": torch.full((N, HK, DV), math.inf)}, r"^value must be finite"),
}


@pytest.mark.parametrize("case", list(INT8_BREAKS), ids=list(INT8_BREAKS))
def test_int8_write_errors(case):
    write_kv_cache_int8(**_int8_args())  # the base call is valid
    over, match = INT8_BREAKS[case]
    args = _int8_args(**over)
    caches = [t for t in (args["k_cache"], args["v_cache"], args["k_scale_cache"]) if isinstance(t, torch.Tensor)]
    before = [t.clone() for t in caches]
    _expect(lambda: write_kv_cache_int8(**args), match)
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(before, caches))
