"""Fixtures of the adapter tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Run these tiny-tensor tests on one intra-op thread, then restore the setting.

    On the 2-core CI container a 1k-element softmax took 19 ms with 2 threads and 8 us with 1
    (thread wake-up dominates); this keeps the module well inside the test-time budget.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
