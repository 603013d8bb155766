"""Seed ``002``'s scenarios: the V0 steps :class:`~conformance.engines.vllm_v0.fa.VllmV0FlashAttention` replays,
two ``engines``-suite cases each, one per layer configuration of :data:`CONFIGS` (case ids come from these tables:
keep names and fields stable).

A :class:`Scenario` is one step's sequences (prompts and decodes, in the case's order), the layer's attention type
(decoder, encoder, encoder-only, encoder-decoder cross) and the model's settings (sliding window ``w``, chunked
prefill, ALiBi, fp8 cache).  :data:`INVARIANCE_SCENARIOS` are the invariance checks
(:mod:`conformance.engines.invariance`), in V0's only configuration (no batch-invariant mode: a ``batch`` or
``neighbour`` difference is reported, not failed); the ``neighbour`` ones at :data:`NEIGHBOUR_CONFIGS`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base import Request
from .metadata import Seq

__all__ = [
    "CONFIGS",
    "DECODER",
    "ENCODER",
    "ENCODER_DECODER",
    "ENCODER_ONLY",
    "INVARIANCE_SCENARIOS",
    "NEIGHBOUR_CONFIGS",
    "SCENARIOS",
    "Scenario",
    "invariance_batch",
]

DECODER, ENCODER, ENCODER_ONLY, ENCODER_DECODER = "decoder", "encoder", "encoder_only", "encoder_decoder"


def _p(new: int, cached: int = 0, encoder: int = 0) -> Seq:
    return Seq(Request(new, cached, encoder), prompt=True)


def _d(new: int, cached: int, encoder: int = 0) -> Seq:
    return Seq(Request(new, cached, encoder), prompt=False)


@dataclass(frozen=True)
class Scenario:
    """One V0 step: sequences in the case's order, the layer's attention type and the model's settings."""

    seqs: tuple[Seq, ...]
    attn_type: str = DECODER
    sliding_window: int | None = None  # the model's w: keys a token sees, itself included
    chunked_prefill: bool = False
    alibi: bool = False
    fp8: bool = False

    @property
    def uses_cache(self) -> bool:
        return self.attn_type != ENCODER_ONLY

    def requests(self) -> tuple[tuple[int, int], ...]:
        """The layer's ``(q_len, kv_len)``: decoder ``(new, cached + new)``, encoder ``(encoder, encoder)``,
        encoder-only ``(new, new)``, cross ``(new, encoder)``."""
        rs = [s.request for s in self.seqs]
        if self.attn_type == ENCODER:
            return tuple((r.encoder, r.encoder) for r in rs)
        if self.attn_type == ENCODER_DECODER:
            return tuple((r.new, r.encoder) for r in rs)
        return tuple((r.new, r.kv) for r in rs)

    def window(self) -> tuple[int | None, int | None]:
        """What the model means by its window, in the harness's spelling (see the module docstring)."""
        w = self.sliding_window
        if w is None:
            return (None, None)
        return (w - 1, w - 1) if self.attn_type == ENCODER_ONLY else (w - 1, 0)


SCENARIOS: dict[str, Scenario] = {
    "prefill": Scenario((_p(37), _p(128), _p(5))),
    "prefix_cached_prefill": Scenario((_p(20, 48), _p(64, 16), _p(7))),
    "spec_decode": Scenario((_d(3, 40), _d(1, 17), _d(4, 99))),
    "decode": Scenario((_d(1, 50), _d(1, 1), _d(1, 300), _d(1, 17))),
    "mixed": Scenario((_d(1, 33), _p(24, 32), _d(1, 70), _p(10)), chunked_prefill=True),
    "mixed_spec": Scenario((_p(16, 16), _d(3, 40), _d(2, 9), _p(5)), chunked_prefill=True),
    "encoder": Scenario((_p(5, encoder=30), _p(3, encoder=64)), attn_type=ENCODER),
    "encoder_only_window": Scenario((_p(40), _p(100), _p(9)), attn_type=ENCODER_ONLY, sliding_window=16),
    "cross_prefill": Scenario((_p(6, encoder=30), _p(1, encoder=47)), attn_type=ENCODER_DECODER),
    "cross_decode": Scenario((_d(1, 5, 30), _d(1, 9, 47), _d(1, 2, 64)), attn_type=ENCODER_DECODER),
    "alibi": Scenario((_p(20, 16), _d(1, 40), _p(12), _d(2, 7)), chunked_prefill=True, alibi=True),
    "fp8_prefill": Scenario((_p(33), _p(70)), fp8=True),
    "fp8_kv_cache": Scenario((_d(1, 60), _p(20, 32), _d(1, 7)), chunked_prefill=True, fp8=True),
    "fp8_spec_decode": Scenario((_d(3, 50), _d(2, 20)), fp8=True),
    "sliding_window_prefill": Scenario((_p(50), _p(9), _p(33)), sliding_window=16),
    "sliding_window_decode": Scenario((_d(1, 60), _d(1, 10), _d(1, 33)), sliding_window=16),
    "sliding_window_spec": Scenario((_d(3, 60), _d(1, 20)), sliding_window=16),
}

#: (heads, kv heads), head dim, dtype, block size of the cases of each scenario (fp8 scenarios run in bf16, the
#: only dtype the seed allows with fp8 scales).
CONFIGS = (((8, 2), 64, "bf16", 16), ((4, 4), 128, "fp16", 256))

#: name -> (invariance kind, step): request 0's rows through the whole step, compared bitwise
#: (:mod:`conformance.engines.invariance`); the batch is the case's ``requests`` (:func:`invariance_batch`).
INVARIANCE_SCENARIOS: dict[str, tuple[str, Scenario]] = {
    "inv_run_mixed": ("run", Scenario((_d(1, 33), _p(24, 32), _d(1, 70), _p(10)), chunked_prefill=True)),
    "inv_batch_decode": ("batch", Scenario((_d(1, 299), _d(1, 50), _d(1, 5), _d(1, 17)))),
    "inv_batch_mixed": ("batch", Scenario((_d(1, 70), _p(24, 32), _d(1, 33), _p(10)), chunked_prefill=True)),
    "inv_batch_prefix_prefill": ("batch", Scenario((_p(20, 48), _p(64, 16), _p(7), _p(9, 100)))),
    # request 0 (a decode, or a 5-token prompt chunk, of 3,000 keys) beside a 129-token prompt chunk after 971
    # cached tokens, which the invariance cuts to 1 (a decode), 9, 10, 64, 65 and 128 new tokens (chunked prefill:
    # decodes and prompt chunks in one step, the prompts' prefill call apart from the decodes' kvcache call)
    "inv_neighbour_decode": ("neighbour", Scenario((_d(1, 2999), _p(129, 971)), chunked_prefill=True)),
    "inv_neighbour_chunk": ("neighbour", Scenario((_p(5, 2995), _p(129, 971)), chunked_prefill=True)),
}

#: the ``neighbour`` scenarios' layer configurations (as :data:`CONFIGS`): the two head dims FA kernels compile
#: templates for, both GQA 7 (as vLLM #51902's 14 / 2 heads): Qwen2.5-0.5B's (d64) and Qwen2.5-7B's (d128).
NEIGHBOUR_CONFIGS = (((14, 2), 64, "bf16", 16), ((28, 4), 128, "bf16", 16))


def invariance_batch(scn: Scenario, requests: tuple[tuple[int, int], ...]) -> Scenario:
    """An invariance scenario's step for the case's ``(q_len, kv_len)`` requests: a request of one new token after
    cached ones is a decode, any other a prompt (chunk) after its cached tokens (the invariance scenarios hold no
    speculative decodes)."""
    seqs = tuple(Seq(Request(q, kv - q), prompt=q > 1 or kv == q) for q, kv in requests)
    return Scenario(seqs, scn.attn_type, scn.sliding_window, scn.chunked_prefill, scn.alibi, scn.fp8)
