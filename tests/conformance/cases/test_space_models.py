"""The case space widened from the model registry: the wide heads levels and the MLA dims are the registry's,
every flash-attention head-dim template is a level, every registry shape classifies to a level of its own
band, and a wide level's cases stay affordable on the CPU."""

from __future__ import annotations

import pytest

from conformance.cases import space
from conformance.cases.sweep import BATCHES, MLA_DIMS
from conformance.fuzz.draw import work
from conformance.models import builtin_registry

REGISTRY = builtin_registry()


def _kind(h: int, hk: int) -> str:
    return "mha" if h == hk else ("mqa" if hk == 1 else f"gqa{h // hk}")


@pytest.mark.parametrize("level", sorted(space.HEAD_MODELS))
def test_wide_heads_levels_are_registry_models(level: str) -> None:
    model_name, kv = space.HEAD_MODELS[level]
    model = REGISTRY.get(model_name)
    h, hk = space.HEADS[level]
    assert (h, hk) == (model.num_heads, model.num_kv_heads if kv is None else kv)
    assert level == f"h{h}-{_kind(h, hk)}"  # the name says the counts
    assert level in space.WIDE_HEADS and space.classify_heads(h, hk) == level
    if kv is not None:  # an override: MLA's absorbed decode reads one latent kv head
        assert model.mla is not None and kv == 1


def test_heads_levels_reach_the_issues_counts_and_ratios() -> None:
    counts = {h for h, _ in space.HEADS.values()}
    ratios = {h // hk for h, hk in space.HEADS.values() if hk > 1}
    assert {32, 40, 64, 128} <= counts and max(ratios) == 16 and 5 in ratios  # Llama 4's 40/8
    assert {(128, 128), (128, 1), (64, 8), (128, 8), (64, 4)} <= set(space.HEADS.values())
    assert space.WIDE_HEADS == {n for n, (h, _) in space.HEADS.items() if h >= 32}
    assert list(space.HEADS)[:6] == ["gqa4", "mha", "gqa2", "gqa3", "gqa8", "mqa"]  # the narrow levels first, as before


def test_dims_levels_hold_every_template_and_the_registry_dims() -> None:
    dims = set(space.AXES["dims"].values)
    assert {(d, d) for d in space.FA_HEAD_DIM_TEMPLATES} <= dims and (224, 224) in dims
    assert space.FA_HEAD_DIM_TEMPLATES == (32, 64, 96, 128, 160, 192, 224, 256)
    for model in REGISTRY:
        if model.mla is not None:
            assert {model.mla.prefill_dims, model.mla.decode_dims} <= dims, model.name
            assert (model.mla.qk_rope_head_dim, model.mla.kv_lora_rank) == MLA_DIMS, model.name
        else:
            assert (model.head_dim, model.dv) in dims, model.name  # 64, 96, 112, 128, 256
    assert {(192, 128), (576, 512), (64, 512)} <= dims
    assert space.AXES["dims"].default == (128, 128)


def test_every_registry_shape_classifies_to_a_level_of_its_band() -> None:
    """TP 1 and every TP shard (and MLA's absorbed decode): a level of the same kind, wide for wide counts."""
    seen = set()
    for model in REGISTRY:
        shapes = [(s.num_heads, s.num_kv_heads) for s in model.tp_shards()]
        if model.mla is not None:
            shapes += [(s.num_heads, 1) for s in model.tp_shards()]  # absorbed decode
        for h, hk in shapes:
            level = space.classify_heads(h, hk)
            seen.add(level)
            # the nearest level on a log scale: GQA bands from 23 q heads, MHA from 17 (8 vs 32), MQA from 33
            first_wide = 17 if h == hk else (33 if hk == 1 else 23)
            assert (level in space.WIDE_HEADS) == (h >= first_wide), (model.name, h, hk, level)
            lh, lhk = space.HEADS[level]
            assert (h == hk) == (lh == lhk) and (hk == 1 < h) == (lhk == 1), (model.name, h, hk, level)
    assert seen >= set(space.HEAD_MODELS)  # every wide level is some model's shape
    assert space.classify_heads(71, 1) == "h128-mqa"  # Falcon-7B
    assert space.classify_heads(40, 10) == "h32-gqa4"  # Phi-4: ratio 4 in the 32 band
    assert space.classify_heads(48, 8) == "h64-gqa8"  # Mixtral 8x22B: ratio 6, no odd level in the 64 band
    assert space.classify_heads(96, 8) == "h128-gqa16"  # Command R+, GLM-4.5
    assert space.classify_heads(32, 16) == "h32-gqa4" and space.classify_heads(32, 2) == "h32-gqa4"


def test_classify_heads_rules() -> None:
    # MHA / MQA: the nearest count of that kind, ties to the smaller
    assert [space.classify_heads(h, h) for h in (1, 16, 17, 64, 65, 256)] == [
        "mha",
        "mha",
        "h32-mha",
        "h32-mha",
        "h128-mha",
        "h128-mha",
    ]
    assert [space.classify_heads(h, 1) for h in (2, 32, 33, 256)] == ["mqa", "mqa", "h128-mqa", "h128-mqa"]
    # GQA: the band, then the ratio's kind (a power of two or not), then the nearest ratio
    assert space.classify_heads(20, 2) == "gqa3" and space.classify_heads(16, 4) == "gqa4"
    assert space.classify_heads(44, 4) == "h40-gqa5"  # ratio 11: the 32 band's odd level
    assert space.classify_heads(64, 2) == "h64-gqa16" and space.classify_heads(64, 32) == "h64-gqa8"
    assert space.classify_heads(256, 128) == "h128-gqa16"
    for name, (h, hk) in space.HEADS.items():
        assert space.classify_heads(h, hk) == name


def test_wide_levels_build_short_request_lists_of_the_same_shape() -> None:
    assert set(space.WIDE_BATCH_SHAPES) == set(space.BATCH_SHAPES)
    for batch in space.BATCH_SHAPES:
        narrow = space.build({"batch": batch, "heads": "gqa8", "dims": (256, 256)})
        wide = space.build({"batch": batch, "heads": "h128-gqa16", "dims": (256, 256)})
        assert wide.requests == BATCHES[space.WIDE_BATCH_SHAPES[batch]]
        assert space.classify(wide)["batch"] == space.classify(narrow)["batch"] == batch
        # the wide case's reference work stays within 16x the narrow one's (8x the heads, shorter requests)
        assert work(wide) <= 8 * work(narrow), batch
        assert sum(q * k for q, k in wide.requests) <= sum(q * k for q, k in narrow.requests)
    worst_narrow = max(work(space.build({"batch": b, "heads": "gqa8", "dims": (256, 256)})) for b in space.BATCH_SHAPES)
    worst_wide = max(
        work(space.build({"batch": b, "heads": w, "dims": (576, 512)}))
        for b in space.BATCH_SHAPES
        for w in space.WIDE_HEADS
    )
    assert worst_wide <= 8 * worst_narrow


def test_points_with_the_new_levels_build_and_round_trip() -> None:
    points = [{"heads": h, "dims": d} for h in space.HEADS for d in space.AXES["dims"].values]
    points += [{"heads": h, "batch": b, "layout": "HND"} for h in space.WIDE_HEADS for b in space.BATCH_SHAPES]
    for p in points:
        case = space.build(p)
        assert {a: space.classify(case)[a] for a in p} == p
