"""Suite ``training``: backward cases as training frameworks build them, for models trained with sliding windows,
soft-cap, sinks and GQA.

The models are registry entries (:mod:`conformance.models`; every value there carries its published
``config.json`` and sources): :data:`TRAINING_MODELS`

* ``gemma-2-9b`` and ``gemma-2-27b``: sliding (window 4096) and global layers alternating, attention-logit soft-cap
  50, GQA (16/8 heads at d 256; 32/16 at d 128 with ``query_pre_attn_scalar`` 144, a non-default softmax scale);
* ``mistral-7b-v0.1``: a 4096-token sliding window on every layer, GQA 32/8, d 128;
* ``llama-3.1-8b``: global layers, GQA 32/8, d 128 (Llama 3 8B's attention);
* ``gpt-oss-20b``: learned per-head sinks on every layer, a 128-token window on alternate layers, GQA 64/8, d 64.

Per model and layer kind (the model's own window, soft-cap, sinks and scale; all heads, as one data-parallel rank
trains them), bf16, one case per batch of :data:`BATCHES`:

* ``pack4k``: documents concatenated in one 4096-token row, position ids restarting at 0 at each document;
  ``cu_seqlens`` derived from the position ids (:func:`conformance.backward.packing.packing_from_position_ids`);
* ``pack8k``: two 8192-token rows of four documents each (a 5000-token document, longer than the 4096-token
  windows, so the window bites);
* ``pad``: a right-padded batch (4 rows of 4096) unpadded by its attention mask
  (:func:`~conformance.backward.packing.unpad_mask`), one request per row;

plus, on ``pack8k`` of one layer kind per model, the ``outliers`` and ``offset_v`` input distributions
(:mod:`conformance.cases.data_inputs`), and the deterministic backward (``bwd_deterministic``) for two models.

A case records its model like the ``models`` suite (``batch_name`` ``<model>@<layer>.tp1.<batch>``), so
:func:`conformance.suites.models.case_model` reads it back and ``attnconf run --model NAME`` selects it.
``lengths="small"`` gives the same cases at CPU sizes (:data:`SMALL_BATCHES`, at most 320 tokens a batch: the 4096
windows then see every key, gpt-oss's 128-token window still bites in the 140-token document).
"""

from __future__ import annotations

import torch

from conformance.backward.packing import packing_from_position_ids, position_ids_for, training_case, unpad_mask
from conformance.cases.case import AttentionCase
from conformance.models.load import builtin_registry
from conformance.models.registry import ModelConfig, Registry

__all__ = ["BATCHES", "DATA_VARIANTS", "DETERMINISTIC", "SMALL_BATCHES", "TRAINING_MODELS", "training_cases"]

#: Registry models of the suite, and the layer kind that also runs the data variants.
TRAINING_MODELS: dict[str, str] = {
    "gemma-2-9b": "sliding",
    "gemma-2-27b": "global",
    "mistral-7b-v0.1": "sliding",
    "llama-3.1-8b": "global",
    "gpt-oss-20b": "sliding",
}
#: Input distributions run on ``pack8k`` of each model's layer kind above.
DATA_VARIANTS = ("outliers", "offset_v")
#: (model, layer kind) pairs that also run the deterministic backward on ``pack8k``.
DETERMINISTIC = (("gemma-2-9b", "sliding"), ("llama-3.1-8b", "global"))

#: Batches: ("pack", documents per row) packed by position ids, or ("pad", (row lengths, padded length)).
BATCHES: dict[str, tuple[str, tuple]] = {
    "pack4k": ("pack", ((1500, 1200, 900, 496),)),
    "pack8k": ("pack", ((5000, 1700, 1000, 492), (2900, 2600, 1800, 892))),
    "pad": ("pad", ((4096, 3001, 2048, 517), 4096)),
}
#: The same batches at CPU sizes (``lengths="small"``).
SMALL_BATCHES: dict[str, tuple[str, tuple]] = {
    "pack4k": ("pack", ((40, 23, 17, 8),)),
    "pack8k": ("pack", ((140, 10, 6, 4), (60, 50, 30, 20))),
    "pad": ("pad", ((64, 41, 20, 7), 64)),
}


def _batch(kind: str, spec: tuple):
    if kind == "pack":
        return packing_from_position_ids(position_ids_for(spec))
    lens, seqlen = spec
    mask = torch.arange(seqlen)[None, :] < torch.tensor(lens)[:, None]  # right padding, as training collators pad
    return unpad_mask(mask, "right")


def _fields(model: ModelConfig, layer: str) -> dict:
    scale = model.softmax_scale
    return dict(
        num_heads=model.num_heads,
        num_kv_heads=model.num_kv_heads,
        head_dim=model.head_dim,
        head_dim_v=model.head_dim_v,
        window=model.window(layer),
        chunk=model.chunk(layer),
        softcap=model.softcap,
        alibi=model.alibi,
        sinks=model.sinks,
        # rounded like the models suite's, so the two suites' ids read alike
        scale=None if scale is None else float(f"{scale:.6g}"),
    )


def training_cases(*, lengths: str = "full", reg: Registry | None = None) -> list[AttentionCase]:
    """Every case of the ``training`` suite, in a stable order (``lengths``: ``full`` or ``small``)."""
    if lengths not in ("full", "small"):
        raise ValueError(f"lengths must be 'full' or 'small', got {lengths!r}")
    reg = reg or builtin_registry()
    table = BATCHES if lengths == "full" else SMALL_BATCHES
    built = {name: _batch(kind, spec) for name, (kind, spec) in table.items()}
    out: list[AttentionCase] = []
    for name, data_layer in TRAINING_MODELS.items():
        model = reg.get(name)
        for layer in model.layer_counts():
            fields = _fields(model, layer)
            for batch, b in built.items():
                tag = f"{model.name}@{layer}.tp1.{batch if lengths == 'full' else 's' + batch}"
                out.append(training_case(b, batch_name=tag, **fields))
                if batch != "pack8k":
                    continue
                if layer == data_layer:
                    out += [training_case(b, batch_name=tag, data=d, **fields) for d in DATA_VARIANTS]
                if (name, layer) in DETERMINISTIC:
                    out.append(training_case(b, batch_name=tag, deterministic=True, **fields))
    return out
