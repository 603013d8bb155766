"""Seed ``004``: vLLM's MLA prefill (new tokens and chunked context merged by LSE), replayed (the engine
``vllm_mla_prefill``): :mod:`~conformance.engines.vllm_mla.prefill`."""

from __future__ import annotations

from .prefill import SCENARIOS, VllmMLAPrefill

__all__ = ["SCENARIOS", "VllmMLAPrefill"]
