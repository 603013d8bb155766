"""One line per named suite (:data:`conformance.suites.registry.SUITES`), for ``attnconf suites``, ``run --help`` and
``cases --help``.

Kept apart from the suite table so that the help texts are built without importing torch (the table imports the
case model): this module imports nothing.  Every suite the table registers has its line here and no other, in the
table's order, each at most :data:`LINE_MAX` characters (``tests/conformance/test_cli_habits.py`` checks both).
"""

from __future__ import annotations

__all__ = ["LINE_MAX", "SUITE_DESCRIPTIONS", "suites_epilog"]

#: The longest line: with the longest name before it, ``attnconf suites`` fits 120 columns.
LINE_MAX = 100

SUITE_DESCRIPTIONS: dict[str, str] = {
    "smoke": "small cases of every mode, forward and backward: a minute on 2 CPU cores",
    "default": "the GPU CI suite: sweeps, covering arrays, fuzz findings, backward",
    "full": "default plus contexts up to 32k keys and every triple of all axes",
    "perf": "timing cases (long prefill, paged decode, fp8, MLA, training's backward): with --time on a GPU",
    "engines": "engine replays: vLLM's and SGLang's attention layers end to end, as the seed engines call them",
    "models": "real models' attention layers at the batches engines serve (pick models with --model)",
    "graphs": "CUDA-graph capture and replay, and bitwise invariance (run to run, batch, splits, neighbour)",
    "limits": "the kernels' limits probed: heads, head dims, block sizes, quantization (each rejection declared)",
    "training": "backward cases as training builds them: packed documents and unpadded batches of real models",
    "peer-fa2-kvcache": "flash-attention v2.8.3's own test_flash_attn_kvcache grid, through this harness's verdict",
    "peer-fa3": "vLLM's FA3 fork's own hopper tests (output, varlen, kvcache grids)",
    "peer-fa4": "flash-attention 4.0.0b27's own cute tests as they run on sm_90",
    "peer-vllm-flash": "vLLM v0.24.0's flash-attn kernel tests (paged varlen, cascade)",
    "peer-vllm-flashmla": "vLLM v0.24.0's FlashMLA kernel test grid",
    "peer-sgl": "sgl-kernel's own test_flash_attention.py (kvcache and varlen grids)",
}


def suites_epilog() -> str:
    """The suites paragraph of ``run --help`` and ``cases --help``: a heading, then ``  NAME  line`` per suite (the
    CLI's formatter keeps those lines apart)."""
    width = max(map(len, SUITE_DESCRIPTIONS))
    rows = [f"  {name:<{width}}  {line}" for name, line in SUITE_DESCRIPTIONS.items()]
    return "\n".join(["suites (--suite NAME; attnconf suites --json for scripts):", *rows])
