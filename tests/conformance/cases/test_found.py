"""The fuzzer's findings kept as regression cases: valid, named, in ``default`` and ``full``, and each one still
declared supported by the backends it was found on where the kernel (not the adapter) was at fault."""

from __future__ import annotations

import pytest

from attnfast.registry import get_backend
from conformance.cases import space
from conformance.cases.found import FOUND, found_cases
from conformance.cases.suites import get_suite

# pytest-xdist (`-n auto --dist loadgroup`, README): the tests that build the default and full suites (21 s and
# 18 s of CPU per process, 2026-11-26) share one worker, so each suite is built once per run
pytestmark = pytest.mark.xdist_group("suites")


def test_found_cases_are_valid_named_and_in_the_gpu_suites() -> None:
    ids = [c.id for c in found_cases()]
    assert len(set(ids)) == len(ids) == len(FOUND)
    default, full = {c.id for c in get_suite("default")}, {c.id for c in get_suite("full")}
    for f in FOUND:
        assert f.case.batch_name.startswith("fz"), f.case.id
        assert not space.violations(space.classify(f.case)), f.case.id
        assert f.case.id in default and f.case.id in full
        assert f.backends and f.finding and f.evidence.startswith("reports/")
        for name in f.backends:
            support = get_backend(name).supports(f.case, "cuda")
            # adapter findings are fixed by a refusal or a translation fix; kernel findings stay runnable
            if f.finding.startswith("adapter:") and "refused" in f.finding:
                assert not support, (f.case.id, name)
            else:
                assert support, (f.case.id, name, support.reason)
