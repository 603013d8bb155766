"""Third-party backends through the ``attnfast.backends`` entry point, without installing anything.

The example package's own ``pyproject.toml`` is parsed for its declaration; ``attnfast.registry``'s
view of ``importlib.metadata`` is replaced by one that lists that entry point, and the package
directory is put on ``sys.path``, exactly what ``pip install`` would provide.
"""

from __future__ import annotations

import types
from importlib import metadata
from pathlib import Path

import pytest

from attnfast import Backend, registry
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs
from fake_fa3 import assert_matches_reference

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples" / "attnfast_example_backend"


def declared_entry_points() -> dict[str, str]:
    """``name -> "module:attr"`` of the example's ``[project.entry-points."attnfast.backends"]``."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python >= 3.11")
    with open(EXAMPLE_DIR / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    return dict(project["entry-points"][registry.GROUP])


def _fake_metadata(entries: dict[str, str]) -> types.SimpleNamespace:
    eps = [metadata.EntryPoint(name=n, value=v, group=registry.GROUP) for n, v in entries.items()]

    def entry_points(*, group: str | None = None, **_: object) -> list[metadata.EntryPoint]:
        return [ep for ep in eps if group in (None, ep.group)]

    return types.SimpleNamespace(entry_points=entry_points)


@pytest.fixture
def example(monkeypatch) -> str:
    entries = declared_entry_points()
    assert list(entries) == ["example-chunked"], f"the example must declare one backend, got {entries}"
    monkeypatch.syspath_prepend(str(EXAMPLE_DIR))
    monkeypatch.setattr(registry, "metadata", _fake_metadata(entries))
    return "example-chunked"


def test_entry_point_backend_is_listed_and_loads(example):
    assert example in registry.available_names()
    backend = registry.get_backend(example)
    assert isinstance(backend, Backend) and backend.name == example and backend.family == "example-chunked"
    assert backend.is_available()


def test_entry_point_must_produce_a_backend(monkeypatch):
    monkeypatch.setattr(registry, "metadata", _fake_metadata({"not-a-backend": "builtins:dict"}))
    with pytest.raises(TypeError, match="must produce an attnfast.base.Backend"):
        registry.get_backend("not-a-backend")


def test_unknown_name_lists_the_known_ones(example):
    with pytest.raises(ValueError, match="example-chunked"):
        registry.get_backend("no-such-backend")


def test_example_declares_refusals_with_reasons(example):
    backend = registry.get_backend(example)
    paged = AttentionCase(requests=((3, 40),), num_heads=4, num_kv_heads=2, head_dim=64, kv_layout="NHD", block_size=16)
    got = backend.supports(paged, "cpu")
    assert not got and got.reason.startswith("paged: reads contiguous keys only"), got.reason
    assert not backend.capabilities()["alibi"] and backend.capabilities()["sinks"]


CASES = [
    AttentionCase(requests=((33, 33), (1, 1), (70, 150)), num_heads=4, num_kv_heads=2, head_dim=64, causal=True),
    AttentionCase(
        requests=((40, 20), (5, 0), (9, 130)),
        num_heads=4,
        num_kv_heads=1,
        head_dim=32,
        head_dim_v=48,
        causal=True,
        window=(70, None),
        softcap=20.0,
        sinks=True,
        dtype="fp16",
    ),
    AttentionCase(
        requests=((17, 100),),
        num_heads=2,
        num_kv_heads=2,
        head_dim=16,
        window=(5, 9),
        scale=0.3,
        dtype="fp32",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_example_backend_matches_reference(example, case):
    backend = registry.get_backend(example)
    assert backend.supports(case, "cpu"), backend.supports(case, "cpu").reason
    inputs = make_inputs(case, seed=3)
    fn = backend.prepare(case, inputs)
    first = fn()
    tight = case.dtype == "fp32"
    assert_matches_reference(
        case,
        inputs,
        first,
        atol=1e-4 if tight else 2e-2,
        rtol=1e-4 if tight else 2e-2,
        label="example-chunked",
    )
    assert (fn().out == first.out).all(), "the prepared callable is not idempotent"
