"""Golden ids of the built-in suites: each suite's case ids, in order, as of the change that added ``append_lens``
(uneven appends).  A case id is recorded in every results file, ledger and baseline, so a change to the case model
must leave these lists alone; a suite that gains or loses cases on purpose updates its line here, and says why.

``peer-fa3`` and ``peer-fa4`` are pinned in ``test_peers.py`` (their grids take ~25 s each to walk; that file walks
them once per module)."""

from __future__ import annotations

import hashlib

import pytest

from conformance.suites.registry import get_suite, suite_names

#: suite -> (number of cases, SHA-256 of their ids in order, one a line)
GOLDEN: dict[str, tuple[int, str]] = {
    "smoke": (156, "a3bddd218376c13c9368c52feabf3e5df4d5edde16fb3becc39848e22d59b0e1"),
    "default": (5450, "06b2911b3e4cddb5aece617f8aff0a0fc61e4088ecb392c86da6554a9277542a"),
    "full": (18242, "77db3297e3db45931afa1747a640f8709980e6d223daf7c4b22f24c0e103ee36"),
    "perf": (103, "5c0833247c7cd9950371d5b5b4c700a3256b871c178504f68a07485d5ca55e8b"),
    "engines": (171, "5e762f17993bd22dc2fefd564fc2da4692b14fb49f8692923150aab92191af77"),
    "models": (733, "d0efb7b663a5fc7906f4fbf99270c4735009570e57d28b80b17b0646da85b557"),
    "graphs": (39, "fbd0228656a10761af5d703520aec868f44b89d290074c4f8d207c412dcca65c"),
    "limits": (412, "df3fbde42883116a0508603865c78acd93a7084957028c27ab01678c747c7b5c"),
    "training": (36, "a7c831ff120222626ba1cfec65efa7d9e0a3d834277765a04c17474949b720ca"),
    "peer-fa2-kvcache": (13964, "7c014227bad0ed8a0513d7b0abbc8335ee177d87f26abcf518372eda6bc29a40"),
    "peer-vllm-flash": (296, "d5f4419924b2a4039e4890b5100da719e0f4ea58130a3dad6773cdb79804ec79"),
    "peer-vllm-flashmla": (144, "97106d1e2daaad9ed854803c699cd50337e07c3c905b60bab3acde56dd761594"),
    "peer-sgl": (1330, "bed1c2e6e08d3a7fb5783671501066c57e847838fbde141e4d460fb27380832f"),
}
#: pinned in test_peers.py
ELSEWHERE = {"peer-fa3", "peer-fa4"}


def test_every_suite_is_pinned_here_or_in_test_peers() -> None:
    assert set(GOLDEN) | ELSEWHERE == set(suite_names()) and not set(GOLDEN) & ELSEWHERE


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_suite_ids_are_the_golden_ones(name: str) -> None:
    ids = [c.id for c in get_suite(name)]
    n, digest = GOLDEN[name]
    assert (len(ids), hashlib.sha256("\n".join(ids).encode()).hexdigest()) == (n, digest), (
        f"{name}: the case ids changed (a recorded id no longer names its case); if the suite changed on purpose, "
        "update GOLDEN and say why"
    )
