"""Promises of attnref.quant that the mutation run (docs "Mutation testing") found unchecked: vLLM's ``"fp8"``
spelling, the choices a bad format name is told, the messages naming the offending type / count / values, the
scale used as an fp32 tensor on the data's device whatever it came as, and ``dims`` refusing non-integers."""

from __future__ import annotations

import re

import pytest
import torch

from attnref import QUANT_FORMATS, amax_scale, dequantize, quant_format, quantize
from attnref.quant import _scale_tensor


def test_fp8_is_vllms_spelling_of_e4m3() -> None:
    """vLLM's ``kv_cache_dtype="fp8"`` means e4m3: the same format object, dtype and 448 bound."""
    fmt = quant_format("fp8")
    assert fmt is QUANT_FORMATS["fp8_e4m3"]
    assert fmt.dtype == torch.float8_e4m3fn and fmt.max == 448.0
    assert quantize(torch.tensor([1000.0]), 1.0, "fp8").dtype == torch.float8_e4m3fn


@pytest.mark.parametrize("bad", ["FP8", "fp16", torch.float16, 3])
def test_unknown_format_lists_names_and_dtypes(bad) -> None:
    with pytest.raises(ValueError, match=r"^fmt must be one of ") as err:
        quant_format(bad)
    msg = str(err.value)
    for name in QUANT_FORMATS:
        assert repr(name) in msg
    for dtype in ("torch.float8_e4m3fn", "torch.float8_e5m2", "torch.int8"):
        assert repr(dtype) in msg
    assert msg.endswith(f"got {bad!r}")


def test_non_tensor_x_is_named_with_its_type() -> None:
    with pytest.raises(ValueError, match=r"^x must be a torch.Tensor, got list$"):
        quantize([1.0, 2.0], 1.0, "int8")


def test_int8_refusal_counts_the_non_finite_values() -> None:
    x = torch.tensor([1.0, float("nan"), 2.0, float("inf"), -float("inf"), 3.0, 4.0])  # 3 of 7
    with pytest.raises(ValueError, match=r"^x must be finite \(no NaN or inf\), got 3 such values$"):
        quantize(x, 1.0, "int8")


@pytest.mark.parametrize("scale", ["0.5", None, [0.5]], ids=["str", "none", "list"])
def test_non_number_scale_is_named_with_its_type(scale) -> None:
    with pytest.raises(ValueError, match=rf"^scale must be a float tensor or number, got {type(scale).__name__}$"):
        quantize(torch.ones(2), scale, "int8")


def test_bad_scale_message_shows_at_most_eight_values() -> None:
    scale = -torch.arange(1.0, 11.0)  # ten negative scales
    with pytest.raises(ValueError, match=r"^scale must be positive and finite \(as fp32\), got ") as err:
        quantize(torch.ones(10), scale, "int8")
    shown = re.search(r"got \[(.*)\]$", str(err.value)).group(1).split(", ")
    assert [float(v) for v in shown] == [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0]


def test_a_wider_scale_is_rounded_to_fp32_before_dividing() -> None:
    """``y = x.float() / scale`` in fp32: an fp64 scale just below 1 is 1.0 in fp32, so 2.5 stays a tie and
    rounds half to even (2); dividing in fp64 would give 2.5000000023 and round to 3."""
    s64 = torch.tensor([1.0 - 2.0**-30], dtype=torch.float64)
    assert quantize(torch.tensor([2.5]), s64, "int8").tolist() == [2]
    assert quantize(torch.tensor([2.5]), s64[0], "int8").tolist() == [2]


@pytest.fixture
def float64_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


@pytest.mark.parametrize("scale", [0.5, 2, torch.tensor(0.5, dtype=torch.float64), torch.tensor([0.5, 2.0])])
def test_scale_is_fp32_on_the_datas_device(scale, float64_default) -> None:
    """The helper's promise (its docstring): the scale as fp32 on the data's device, whatever it came as and
    whatever torch's default dtype is.  The device matters on a GPU, where a CPU scalar divisor is applied as a
    multiplication by its reciprocal (attnref.quant.amax_scale's comment); ``meta`` stands in for one here."""
    for like in (torch.ones(2, dtype=torch.float32), torch.empty(2, device="meta")):
        s = _scale_tensor("scale", scale, like, positive=False)
        assert s.dtype == torch.float32 and s.device == like.device
        if like.device.type == "cpu":
            assert s.tolist() == torch.as_tensor(scale, dtype=torch.float32).tolist()


def test_dequantize_moves_a_scale_to_the_datas_device() -> None:
    xq = torch.empty(3, dtype=torch.int8, device="meta")
    out = dequantize(xq, torch.tensor([1.0, 2.0, 3.0]))
    assert out.device.type == "meta" and out.dtype == torch.float32 and tuple(out.shape) == (3,)


@pytest.mark.parametrize("dims", [(1.5,), ("a",), (0, 1.0), (None,)])
def test_dims_must_be_ints(dims) -> None:
    with pytest.raises(ValueError, match=r"^dims must be None, an int or a non-empty tuple of ints, got "):
        amax_scale(torch.ones(2, 3), "int8", dims=dims)
