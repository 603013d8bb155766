"""Suites of the kernels' own test grids, run through this harness's verdict (``peer-*``): one module per peer
source, each citing its repository, commit or tag, file and test functions, listing every parameter value and what
is left out and why (:mod:`.fa2`, :mod:`.fa3`, :mod:`.fa4`, :mod:`.vllm`, :mod:`.sgl`); :mod:`.grid` walks a grid
point by point and keeps every combination without a case with its reason (refused by the case model, pending a
case field, the same call as another point).  :data:`PEER_SUITES` is what :data:`conformance.suites.registry.SUITES`
reads.
"""

from __future__ import annotations

from conformance.suites.peers.fa2 import PEER_FA2_KVCACHE
from conformance.suites.peers.fa3 import PEER_FA3
from conformance.suites.peers.fa4 import PEER_FA4
from conformance.suites.peers.grid import PeerSuite
from conformance.suites.peers.sgl import PEER_SGL
from conformance.suites.peers.vllm import PEER_VLLM_FLASH, PEER_VLLM_FLASHMLA

__all__ = ["PEERS", "PEER_SUITES", "PeerSuite"]

#: Every peer suite, by name.
PEERS: dict[str, PeerSuite] = {
    s.name: s for s in (PEER_FA2_KVCACHE, PEER_FA3, PEER_FA4, PEER_VLLM_FLASH, PEER_VLLM_FLASHMLA, PEER_SGL)
}
#: Their builders (``attnconf run --suite NAME``).
PEER_SUITES = {name: suite.cases for name, suite in PEERS.items()}
