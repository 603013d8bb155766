"""The FA3 fork's window schedule (:mod:`attnfast.fa3_vllm_window`) on cases worked out by hand from its source: a
window that moves the key pointer on the intra-warpgroup-overlap path (d128 and fp8 d64), one that does not, the d64
bf16/fp16 path without overlap, the control with the shifted key count; and the per-request split counts."""

from __future__ import annotations

import numpy as np
import pytest

from attnfast.fa3_vllm_window import (
    fa3_vllm_request_splits,
    fa3_vllm_window_rows,
    fa3_vllm_window_schedule,
    window_bounds,
)
from conformance.cases.case import AttentionCase


def one_head(sq_sk: int, head_dim: int, left: int, **kw) -> AttentionCase:
    return AttentionCase(((sq_sk, sq_sk),), 1, 1, head_dim, causal=True, window=(left, 0), num_splits=1, **kw)


def test_d128_window_500_moves_the_key_pointer_and_adds_keys_right_of_the_window() -> None:
    """d128 bf16, (768, 768), causal window (500, 0): tiles 128 x 128 with overlap.  Query tile 4 (rows 512..639):
    n_offset = 512 - 500 = 12, seqlen_k 756, key tiles 0..4 (nb_end = ceil((640 + 756 - 768) / 128) = 5); A from
    the unshifted count is 512 / 128 = 4 (shifted: 3), B = ceil((640 - 500) / 128) = 2 (shifted: 1), so tiles 2 and 3
    run unmasked: keys 12 + 256 .. 12 + 512 = [268, 524).  Row i sees keys up to i: rows 512..522 get 523 - i keys
    right of their window (11 down to 1).  Tile 5 (rows 640..767): offset 140, A = 5, B = ceil(268 / 128) = 3, tile 3
    unmasked: keys [524, 652), rows 640..650 get 651 - i.  Tiles 1..3 (offset 0) run unmasked the tiles every row of
    theirs sees whole ([0, 128), [0, 256), [128, 384)): right."""
    sch = fa3_vllm_window_schedule(one_head(768, 128, 500))
    assert (sch.block_m, sch.block_n, sch.overlap, sch.packed) == (128, 128, True, False)
    (req,) = sch.requests
    want = np.zeros(768, dtype=np.int64)
    want[512:523] = 523 - np.arange(512, 523)
    want[640:651] = 651 - np.arange(640, 651)
    assert np.array_equal(req.extra_right[:, 0], want)
    assert not req.extra_left.any() and not req.missing.any()
    assert req.unmasked == [(128, 256, 0, 128), (256, 384, 0, 256), (384, 512, 128, 384), (512, 640, 268, 524),
                            (640, 768, 524, 652)]  # fmt: skip
    assert sch.totals() == {"wrong_rows": 22, "rows_extra_right": 22, "rows_extra_left": 0, "rows_missing": 0,
                            "max_extra_keys": 11}  # fmt: skip
    assert fa3_vllm_window_rows(one_head(768, 128, 500)) == 22
    # the control: A and B from the shifted count (the fork's other path): A = 3, B = 1 in tiles 4 and 5, so their
    # tiles 1..2 run unmasked, inside every row's window
    control = fa3_vllm_window_schedule(one_head(768, 128, 500), correct_bounds=True)
    assert control.totals()["wrong_rows"] == 0
    assert control.requests[0].unmasked[3:] == [(512, 640, 140, 396), (640, 768, 268, 524)]


def test_a_window_that_does_not_move_the_key_pointer_is_right() -> None:
    """(640, 640) with window (600, 0): n_offset = max(0, 128 m - 600) is 0 for every query tile (the last starts at
    512), so the unshifted count is the shifted one; a window reaching past the keys is no window for the fork."""
    sch = fa3_vllm_window_schedule(one_head(640, 128, 600))
    assert sch is not None and sch.totals()["wrong_rows"] == 0
    assert fa3_vllm_window_schedule(one_head(640, 128, 639)) is None  # left >= seqlen_k - 1: unbounded
    assert fa3_vllm_window_schedule(AttentionCase(((64, 64),), 1, 1, 128, causal=True)) is None


def test_d64_takes_the_path_without_overlap_in_bf16_and_the_overlap_path_in_fp8() -> None:
    """d64, (768, 768), window (500, 0).  bf16: tiles 192 x 160 without intra-warpgroup overlap, A and B from the
    shifted count: right.  fp8: 192 x 128 with overlap; query tile 3 (rows 576..767): offset 76, A = 576 / 128 = 4
    (shifted: 3), B = ceil(268 / 128) = 3, so tile 3 runs unmasked, keys [460, 588): rows 576..586 get 587 - i."""
    bf16 = fa3_vllm_window_schedule(one_head(768, 64, 500))
    assert (bf16.block_m, bf16.block_n, bf16.overlap) == (192, 160, False) and bf16.totals()["wrong_rows"] == 0
    fp8 = fa3_vllm_window_schedule(one_head(768, 64, 500, quant="fp8_e4m3", descale="head"))
    assert (fp8.block_m, fp8.block_n, fp8.overlap) == (192, 128, True)
    want = np.zeros(768, dtype=np.int64)
    want[576:587] = 587 - np.arange(576, 587)
    assert np.array_equal(fp8.requests[0].extra_right[:, 0], want)
    assert fp8.requests[0].unmasked == [(192, 384, 0, 128), (384, 576, 128, 384), (576, 768, 460, 588)]


def test_packed_gqa_heads_share_rows_and_kv_heads_multiply() -> None:
    """Two query heads over one kv head are packed into the query tile (units ``row * 2 + head``); with two kv
    heads the (row, head) count doubles.  The d128 case of the peer triage: window 500 over 2048 keys adds one key
    to 11 rows per tile that moves the pointer (22 rows x 4 heads); 512 and 511 end a key tile where the first row's
    window ends (none), 510 leaves one key."""
    base = AttentionCase(((2048, 2048),), 4, 4, 128, causal=True, window=(500, 0))
    assert fa3_vllm_window_rows(base) == 22 * 4
    assert [fa3_vllm_window_rows(base.replace(window=(w, 0))) for w in (512, 511, 510)] == [0, 0, 2 * 4]
    gqa = AttentionCase(((300, 300),), 2, 1, 128, causal=True, window=(214, 0), num_splits=1)
    sch = fa3_vllm_window_schedule(gqa)
    assert sch.packed and sch.block_m == 128 and sch.totals()["wrong_rows"] == 82
    assert fa3_vllm_window_rows(gqa.replace(num_heads=4, num_kv_heads=2)) == 2 * 82


@pytest.mark.parametrize(
    "case, rows",
    [
        (AttentionCase(((300, 300),), 2, 1, 128, causal=True, window=(214, 0), num_splits=3), 0),
        (AttentionCase(((520, 520),), 2, 1, 96, window=(256, 37), num_splits=3), 180),
    ],
)
def test_a_split_cuts_the_key_tiles_of_each_query_tile(case, rows) -> None:
    """With 3 splits pinned each split gets its share of the key tiles and masks its own last one: the minimal d128
    case's unmasked tiles become split boundaries (no row wrong; measured: it passes on the H100), the d96 one keeps
    its 180 rows (measured: it fails)."""
    assert fa3_vllm_window_rows(case) == rows


def test_the_planner_split_counts() -> None:
    """A pinned count is the static one; every request gets at most it, by its share of the key blocks; one split
    without GQA packs only with equal head dims."""
    pinned = AttentionCase(((1000, 1000), (10, 10)), 4, 2, 128, window=(100, 100), num_splits=3)
    static, pack, per = fa3_vllm_request_splits(pinned)
    assert static == 3 and pack and per[0] >= per[1] >= 1 and max(per) <= 3
    assert fa3_vllm_request_splits(pinned.replace(num_splits=1)) == (1, True, (1, 1))


def test_modelled_calls_only() -> None:
    """Context parallel, chunked, appending, q_v, engine, graph, invariance and backward calls are not modelled."""
    case = one_head(768, 128, 500)
    assert fa3_vllm_window_rows(case) > 0
    others = (case.replace(backward=True, num_splits=None), case.replace(invariance="run"),
              case.replace(chunk=256), case.replace(append=True))  # fmt: skip
    for other in others:
        assert fa3_vllm_window_schedule(other) is None and fa3_vllm_window_rows(other) == 0


def test_window_bounds_are_bottom_right_aligned() -> None:
    """Row i of a request (sq, sk) sees keys [i + sk - sq - left, i + sk - sq + right], clipped to the keys."""
    case = AttentionCase(((4, 10),), 1, 1, 64, window=(2, 1))
    lo, hi = window_bounds(case, 0)
    assert lo.tolist() == [4, 5, 6, 7] and hi.tolist() == [8, 9, 10, 10]
    lo, hi = window_bounds(case.replace(causal=True, window=(2, 0)), 0)
    assert lo.tolist() == [4, 5, 6, 7] and hi.tolist() == [7, 8, 9, 10]


def test_window_bounds_agree_with_the_ledgers_spelling_of_the_rule() -> None:
    """The schedule's true windows (attnref's rule, issue 27 item 3) equal the ledger's own numpy spelling of the
    visibility rule (``conformance.ledger.fields``) on every request of the modelled calls among 150 draws."""
    from conformance.fuzz.draw import DrawLimits, draw
    from conformance.ledger.fields import _visible_bounds

    limits = DrawLimits(max_tokens=256, max_heads=8)
    cases = [d.case for d in (draw(3, i, limits) for i in range(150)) if d.case is not None]
    modelled = [c for c in cases if c.cp_world == 1 and c.chunk is None]
    assert sum(c.has_window for c in modelled) >= 10 and sum(c.causal for c in modelled) >= 10
    for case in modelled:
        for b in range(case.batch):
            lo, hi = window_bounds(case, b)
            want_lo, want_hi = _visible_bounds(case, b)
            assert lo.dtype == np.int64 and np.array_equal(lo, want_lo) and np.array_equal(hi, want_hi), case.id
