"""The declaration rule in one place (issue 27 item 3): :func:`attnfast.base.declared_support` is what
``Backend.supports`` checks before any shape limit, and :func:`attnfast.base.declared_support_of_info` the same rule
read from a backend's describe-info (the header entry the worker returns), which the fuzzer applies in the parent
process.  Both must answer alike, with the same text, for every built-in adapter."""

from __future__ import annotations

import pytest

from attnfast.base import (
    NOT_DECLARED,
    Backend,
    declared_support,
    declared_support_of_info,
    info_devices,
    runs_on,
)
from attnfast.registry import BUILTIN, get_backend
from conformance.cases.case import AttentionCase
from conformance.fuzz.draw import DrawLimits, draw
from conformance.running.env import backend_info
from conformance.suites.registry import get_suite

DEVICES = ("cpu", "cuda", "cuda:1")


@pytest.fixture(scope="module")
def sample() -> list[AttentionCase]:
    """The smoke suite and 150 draws of the fuzzer's case space (every axis, the opt-in features included)."""
    drawn = (draw(11, i, DrawLimits(max_tokens=256, max_heads=16)).case for i in range(150))
    return list(get_suite("smoke")) + [c for c in drawn if c is not None]


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_the_info_rule_answers_as_the_adapter_on_every_builtin(name: str, sample: list[AttentionCase]) -> None:
    backend = get_backend(name)
    info = backend_info(backend)
    refused_some = False
    for case in sample:
        for device in DEVICES:
            declared = Backend.supports(backend, case, device)
            of_info = declared_support_of_info(case, info, device)
            assert (of_info.ok, of_info.reason) == (declared.ok, declared.reason), (name, device, case.id)
            full = backend.supports(case, device)  # the shape limits come after the declarations
            if not declared:
                refused_some = True
                assert (full.ok, full.reason) == (False, declared.reason), (name, device, case.id)
    assert refused_some, f"{name}: the sample reached none of its declared refusals"


def test_refusal_texts_are_unchanged() -> None:
    case = AttentionCase(requests=((3, 5),), num_heads=2, num_kv_heads=1, head_dim=64)
    info = backend_info(get_backend("fa2"))
    assert declared_support_of_info(case, info, "cpu").reason == "runs on cuda, not cpu"
    assert info_devices(info) == ("cuda",)
    assert declared_support_of_info(case, info, "cuda:1").ok
    assert declared_support_of_info(case.replace(dtype="fp32"), info, "cuda").reason == (
        "fp32: FA2 takes fp16 and bf16 inputs only"
    )
    assert declared_support_of_info(case.replace(sinks=True), info, "cuda").reason == (
        "sinks: FA2 has no attention-sink argument"
    )
    mla = backend_info(get_backend("flashmla"))
    assert declared_support_of_info(case.replace(num_splits=2), mla, "cuda").reason == (
        "splits: num_splits must be None (FlashMLA schedules splits itself)"
    )
    padded = case.replace(head_dim_v=32, v_padded=True)
    assert declared_support_of_info(padded, mla, "cuda").reason == f"v_pad: {NOT_DECLARED}"
    assert get_backend("sdpa-cpu").supports(case, "cuda").reason == "runs on cpu, not cuda"


def test_the_info_is_read_as_recorded() -> None:
    info = {"devices": "cpu,cuda", "refuses.softcap": "no softcap", "refuses.v_pad": "no"}
    case = AttentionCase(requests=((3, 5),), num_heads=2, num_kv_heads=1, head_dim=64)
    assert declared_support_of_info(case, info, "cpu").reason == ""
    assert declared_support_of_info(case.replace(softcap=5.0), info, "cpu").reason == "softcap: no softcap"
    padded = case.replace(head_dim_v=32, v_padded=True)
    assert declared_support_of_info(padded, info, "cpu").reason == "v_pad: no"
    assert declared_support_of_info(case, {"devices": "cuda"}, "cpu").reason == "runs on cuda, not cpu"
    # no device recorded: nothing to check; a backend that declares none runs nowhere
    assert info_devices({}) is None and info_devices({"devices": ""}) is None
    assert declared_support_of_info(case, {}, "cpu").ok
    assert runs_on((), "cpu").reason == "runs on , not cpu"
    # a padded case is judged as the padded, equal-dims call: its own features, not the original's dv
    assert declared_support(padded, "cpu", ("cpu",), {"dv": "unequal dims"}).ok
    assert declared_support(case.replace(head_dim_v=32), "cpu", ("cpu",), {"dv": "x"}).reason == "dv: x"


def test_the_fuzzer_reads_declarations_without_importing_an_adapter() -> None:
    """The parent process of ``attnconf fuzz`` applies the rule to the worker's describe-info: importing the campaign
    loads the protocol (``attnfast.base``) and the registry's table, never an adapter module."""
    import subprocess
    import sys
    from pathlib import Path

    probe = "import sys, conformance.fuzz.campaign\nprint(sorted(m for m in sys.modules if m.startswith('attnfast')))"
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", probe], cwd=repo, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['attnfast', 'attnfast.base', 'attnfast.registry']"
