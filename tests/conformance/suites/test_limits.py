"""Suite ``limits`` (issue 19 item 4): the probe grid reaches past every limit the adapters declare."""

from __future__ import annotations

from conformance.suites.limits import BLOCK_SIZES, HEAD_DIMS, HEADS, limits_cases


def test_limits_cases_are_unique_small_and_cross_the_limits():
    cases = limits_cases()
    assert len({c.id for c in cases}) == len(cases)
    assert max(c.total_kv for c in cases) <= 200 and max(c.batch for c in cases) <= 4
    heads = {(c.num_heads, c.num_kv_heads) for c in cases}
    assert set(HEADS) <= heads and (256, 8) in heads and {16, 32, 128} <= {h // k for h, k in heads}
    dims = {c.head_dim for c in cases}
    assert set(HEAD_DIMS) <= dims and {224, 264, 512, 20} <= dims  # FA templates, past them, odd widths
    assert {(c.head_dim, c.dv) for c in cases if c.dv != c.head_dim} >= {(192, 128), (64, 512), (576, 512)}
    assert {c.block_size for c in cases if c.paged} == set(BLOCK_SIZES)
    features = set().union(*(c.features() for c in cases))
    for f in (
        "sinks",
        "window",
        "softcap",
        "fp16",
        "fp32",
        "hnd",
        "fp8_e4m3",
        "fp8_e5m2",
        "fp8_kv_only",
        "descale_head",
        "int8_t1",
        "qv",
    ):
        assert f in features, f


def test_every_limits_case_runs_or_is_refused_with_a_reason_on_cpu():
    from attnfast.registry import get_backend

    backend = get_backend("sdpa-cpu")
    for case in limits_cases():
        support = backend.supports(case, "cpu")
        assert support or support.reason, case.id
