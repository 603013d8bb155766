"""The fuzzer's findings kept as regression cases: valid, named, in ``default`` and ``full``, and each one still
declared supported by the backends it was found on where the kernel (not the adapter) was at fault."""

from __future__ import annotations

from attnfast.registry import get_backend
from conformance.cases import space
from conformance.suites.found import FOUND, found_cases
from conformance.suites.registry import get_suite


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
