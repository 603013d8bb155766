"""Ledger fields at the edges the mutation runs found unpinned: FA3's one-MMA-warpgroup rule at exactly 64 packed
query rows, the invariance kinds each switch field looks at (and False for every other case), ``_own``, which
builds the fields of the case's own attributes; and each derived field against the fact it states: the visible key
bounds against the reference's rule (attnref.mask, context parallelism included), the keyless query tiles (the
ledger's 64-row tiles, FA3's 128 / group rows) against the keyless rows of each request, the keys a window leaves
out on the left, FA2's seqlen_k against the call attnfast.fa2 builds, its entry point and window normalisation.

``_own`` and ``_case_fields`` run while ``FIELDS`` is built, at import: mutmut imports the tests before it picks a
mutant, so a test can tell a mutant of either apart only by calling it.  The fields are read through
``FIELDS[name].get`` (what :meth:`CaseView.value` calls), not through the cached :func:`case_view`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnfast.fa2 import KVCACHE, VARLEN, fa2_entry, fa2_plan
from attnref.mask import row_bounds
from attnref.varlen import cp_sequence_options
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs
from conformance.ledger.fields import FIELDS, _case_fields, _fa2_seqlen_k, _own, _visible_bounds, case_view
from conformance.verdict.reference import case_options


def case(**kw) -> AttentionCase:
    kw.setdefault("num_heads", 1)
    kw.setdefault("num_kv_heads", 1)
    kw.setdefault("head_dim", 128)
    return AttentionCase(**kw)


def field(name: str, c: AttentionCase):
    return FIELDS[name].get(c)


@pytest.mark.parametrize(("heads", "rows"), [((1, 1), (64, 65)), ((8, 1), (8, 9)), ((32, 4), (8, 9))])
def test_one_mma_warpgroup_takes_up_to_64_packed_query_rows_and_not_65(heads, rows):
    """FA3's one-warpgroup rule is ``max_seqlen_q x group <= 64``: a batch invariance whose request 0 alone packs
    exactly 64 rows and whose batch packs more switches kernels; one whose calls pack 63 and 64 rows does not."""
    # kills x__fa3_one_mma_wg__mutmut_7 (< 64) and _8 (<= 65)
    h, hk = heads
    at, over = rows
    switch = case(requests=((at, 100), (over, 100)), num_heads=h, num_kv_heads=hk, invariance="batch")
    assert field("fa3_one_mma_wg_switch", switch) is True
    same_side = switch.replace(requests=((at - 1, 100), (at, 100)))
    assert field("fa3_one_mma_wg_switch", same_side) is False
    assert field("fa3_group_rows_switch", switch) is True and field("fa3_group_rows_switch", same_side) is False


def test_one_mma_warpgroup_switch_covers_a_growing_neighbour():
    """A neighbour invariance is judged too: request 0 alone (1 row) takes one warpgroup, beside a neighbour of 65
    queries it does not."""
    # kills x__fa3_one_mma_wg_switch__mutmut_4, _5 ("neighbour" misspelt: the neighbour kind falls through to False)
    grow = case(requests=((1, 300), (65, 300)), invariance="neighbour")
    assert field("fa3_one_mma_wg_switch", grow) is True
    assert field("fa3_one_mma_wg_switch", grow.replace(head_dim=64)) is False  # the rule is d128 only


def test_group_rows_switch_covers_a_batch_invariance():
    """The rows rule at any head dim judges a batch invariance: request 0 alone packs 8 x 8 = 64 rows, its batch
    9 x 8."""
    # kills x__fa3_group_rows_switch__mutmut_2, _3 ("batch" misspelt: the batch kind falls through to False)
    batch = case(requests=((8, 300), (9, 300)), num_heads=8, head_dim=64, invariance="batch")
    assert field("fa3_group_rows_switch", batch) is True
    assert field("fa3_group_rows_switch", batch.replace(requests=((7, 300), (8, 300)))) is False


@pytest.mark.parametrize("invariance", ["", "run", "splits"])
def test_switch_fields_are_false_outside_batch_and_neighbour_invariance(invariance):
    """Calls that switch kernels across an invariance's variants exist only for batch and neighbour invariances:
    any other case (requests that would switch under a batch invariance) reads False."""
    # kills x__fa3_one_mma_wg_switch__mutmut_6 and x__fa3_group_rows_switch__mutmut_6 (return True for them)
    c = case(requests=((64, 100), (65, 100)), invariance=invariance)
    assert field("fa3_one_mma_wg_switch", c) is False
    assert field("fa3_group_rows_switch", c) is False


def test_a_run_invariance_or_no_invariance_has_one_longest_q_len():
    """``invariance_max_q_len_varies`` is False for a case without invariance and for a run invariance (two equal
    calls), True where request 0 alone is shorter than its batch's longest query."""
    # kills x__invariance_max_q_len_varies__mutmut_2 (True without invariance) and _3 (>= 1: any invariance)
    c = case(requests=((1, 100), (9, 100)))
    assert field("invariance_max_q_len_varies", c) is False
    assert field("invariance_max_q_len_varies", c.replace(invariance="run")) is False
    assert field("invariance_max_q_len_varies", c.replace(invariance="batch")) is True


@pytest.mark.parametrize(
    ("name", "kind", "value"),
    [("head_dim", "int", 128), ("causal", "bool", True), ("dtype", "str", "fp16"), ("block_size", "int", 16)],
)
def test_own_field_reads_the_case_attribute_with_its_kind_and_help(name, kind, value):
    """``_own(name, kind, help)`` is the field reading ``case.<name>``, of the kind and help given, not nullable
    unless asked; ``nullable=True`` is kept."""
    # kills x__own__mutmut_1 .. _14 (each changes the kind, help, getter or nullable the Field gets)
    c = case(requests=((4, 20),), causal=True, dtype="fp16", kv_layout="NHD", block_size=16)
    f = _own(name, kind, f"the {name}")
    assert (f.kind, f.help, f.nullable) == (kind, f"the {name}", False)
    assert f.get(c) == value
    g = _own(name, kind, "h", True)
    assert g.nullable is True and g.get(c) == value
    assert _own(name, kind, "h", nullable=True).nullable is True


# ---------------------------------------------------------------------------------------------- visible key bounds
# ``_visible_bounds`` states attnref.mask's rule (SEMANTICS.md section 2; cp in absolute positions with the totals
# conformance.cases.inputs builds): the reference's own ``row_bounds`` is the oracle, compared strictly (shape,
# dtype, values), and every field built on the bounds follows from it.

LADDER = (128, 64, 32, 16, 8, 4, 2, 1)


def reference_bounds(c: AttentionCase) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each request's ``[lo, hi)`` per query row by the reference (attnref.mask.row_bounds), the cp totals those
    conformance.cases.inputs gives the call."""
    options = cp_sequence_options(case_options(c), list(c.kv_lens), make_inputs(c).cp_tot_seqused_k)
    out = []
    for (sq, sk), opts in zip(c.requests, options):
        lo, hi = row_bounds(torch.arange(sq), sq, sk, opts)
        out.append((lo.numpy(), hi.numpy()))
    return out


@st.composite
def masked_cases(draw, max_q: int = 40) -> AttentionCase:
    """Cases over every mask the bounds know: causal, a window (either side), a chunk, or context parallelism
    (causal only), with requests that leave rows without keys (sq > sk, kv_len 0) and GQA groups."""
    lens = st.integers(0, max_q)
    requests = tuple(draw(st.lists(st.tuples(lens, lens), min_size=1, max_size=5)))
    group = draw(st.sampled_from([1, 2, 3, 7, 8, 16]))
    kw = dict(requests=requests, num_heads=group, num_kv_heads=1, head_dim=8)
    world = draw(st.sampled_from([1, 1, 2, 3, 4]))
    if world > 1:
        return AttentionCase(**kw, causal=True, cp_world=world, cp_rank=draw(st.integers(0, world - 1)))
    causal = draw(st.booleans())
    side = st.none() | st.integers(0, max_q + 2)
    left, right = draw(side), (draw(st.none() | st.just(0)) if causal else draw(side))
    chunk = draw(st.none() | st.integers(1, 9))
    return AttentionCase(**kw, causal=causal, window=(left, right), chunk=chunk)


@given(masked_cases())
@settings(max_examples=300)
def test_visible_bounds_are_the_references_row_bounds(c):
    """Every request's bounds are the reference's, row for row, as int64 arrays of one entry per query row; the
    rows without keys are counted from them."""
    want = reference_bounds(c)
    for b, (lo, hi) in enumerate(want):
        got = _visible_bounds(c, b)
        np.testing.assert_array_equal(got[0], lo, strict=True)
        np.testing.assert_array_equal(got[1], hi, strict=True)
    assert field("rows_without_keys", c) == sum(int(np.count_nonzero(lo >= hi)) for lo, hi in want)
    assert field("rows_with_keys", c) == c.total_q - field("rows_without_keys", c)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_context_parallel_bounds_of_every_rank_and_every_remainder(world):
    """Context parallelism: each rank's shard of five sequences whose totals meet every remainder mod the world
    (conformance.cases.inputs: total = kv_len x world + rank - b mod world), with rows above the diagonal, a
    sequence without keys and more queries than keys, bounds as the reference's cp rule gives them."""
    requests = ((9, 1), (6, 3), (1, 2), (7, 0), (4, 4))
    for rank in range(world):
        c = case(requests=requests, causal=True, cp_world=world, cp_rank=rank, head_dim=8)
        for b, (lo, hi) in enumerate(reference_bounds(c)):
            got = _visible_bounds(c, b)
            np.testing.assert_array_equal(got[0], lo, strict=True)
            np.testing.assert_array_equal(got[1], hi, strict=True)


# ---------------------------------------------------------------------------------------------- keyless tiles
# A request's rows without keys are a prefix of its rows (a row's hi never falls as i grows, and a row on or right
# of key 0's diagonal sees its own key): checked against the reference below.  So with n keyless rows of sq, an
# aligned tile of T rows (cut at the request's end) without keys exists iff min(T, sq) <= n, and FA3's first
# 128-row tile (rows 0 .. 127 // g with a packed group of g) is keyless iff n >= min(sq, 127 // g + 1).


def keyless_prefixes(c: AttentionCase) -> list[int]:
    """Each request's number of rows without keys, by the reference, checked to be a prefix of its rows."""
    out = []
    for lo, hi in reference_bounds(c):
        empty = lo >= hi
        n = int(np.count_nonzero(empty))
        assert not empty[n:].any(), "keyless rows are a prefix"
        out.append(n)
    return out


@given(masked_cases(max_q=300))
@settings(max_examples=150)
def test_keyless_tiles_follow_from_the_keyless_rows_of_each_request(c):
    """``keyless_query_tile`` is the largest T of 128 .. 1 with min(T, sq) <= n for some request (0 when every row
    sees a key); ``fa3_keyless_m_block`` holds when some request's first tile of the fork's forward (kBlockM packed
    rows: rows 0 .. (kBlockM - 1) // g) has no key."""
    from attnfast.decisions import fa3_vllm_fwd_tile

    g = c.num_heads // c.num_kv_heads
    first = (fa3_vllm_fwd_tile(c)[0] - 1) // g + 1
    dims = list(zip(c.q_lens, keyless_prefixes(c)))
    tile = max((t for t in LADDER for sq, n in dims if n and min(t, sq) <= n), default=0)
    assert field("keyless_query_tile", c) == tile
    assert field("fa3_keyless_m_block", c) is any(sq and n >= min(sq, first) for sq, n in dims)


def test_keyless_query_tile_is_the_largest_power_of_two_of_keyless_rows_up_to_128():
    """n keyless rows on top of a causal (n + 2, 2) request: the largest aligned tile is the largest power of two
    <= n (128 at most; 0 without such rows); a request without keys is one tile of any size (128)."""
    for n in range(0, 140):
        want = 0 if n == 0 else min(128, 2 ** (n.bit_length() - 1))
        assert field("keyless_query_tile", case(requests=((n + 2, 2),), causal=True)) == want, n
    assert field("keyless_query_tile", case(requests=((3, 0), (200, 200)))) == 128
    assert field("keyless_query_tile", case(requests=((200, 200), (5, 5)), causal=True)) == 0


@pytest.mark.parametrize(("g", "d", "rows"), [(1, 64, 192), (1, 128, 128), (8, 64, 24), (3, 128, 43), (16, 64, 12),
                                              (256, 128, 1)])  # fmt: skip
def test_fa3_first_tile_is_keyless_from_its_kblockm_over_g_rows_on(g, d, rows):
    """The fork's first tile holds rows 0 .. (kBlockM - 1) // g (kBlockM 192 at head dim 64, 128 at 128: the fork's
    tile_size.h): keyless with that many keyless rows, not with one fewer; a request shorter than the tile is
    keyless only as a whole; every row seeing a key leaves every tile keyed, also the last tile of one row."""
    from attnfast.decisions import fa3_vllm_fwd_tile

    heads = dict(num_heads=g, num_kv_heads=1, head_dim=d)
    keyless = case(requests=((rows + 5, 5),), causal=True, **heads)
    assert (fa3_vllm_fwd_tile(keyless)[0] - 1) // g + 1 == rows
    assert field("fa3_keyless_m_block", keyless) is True
    assert field("fa3_keyless_m_block", case(requests=((rows + 4, 5),), causal=True, **heads)) is False
    assert field("fa3_keyless_m_block", case(requests=((rows, 0),), **heads)) is True
    assert field("fa3_keyless_m_block", case(requests=((129, 129), (1, 1)), causal=True, **heads)) is False


# ---------------------------------------------------------------------------------------------- keys left of window
@given(masked_cases())
@settings(max_examples=200)
def test_keys_left_of_window_is_the_largest_lo_of_a_row_with_keys(c):
    """With a bounded left window side: the most keys a row that sees keys leaves out on its left (its ``lo``, the
    reference's); 0 without one (a chunk alone, context parallelism) and for rows without keys."""
    want = 0
    if c.window[0] is not None:
        want = max((int(lo[i]) for lo, hi in reference_bounds(c) for i in range(len(lo)) if lo[i] < hi[i]), default=0)
    assert field("keys_left_of_window", c) == want


def test_keys_left_of_window_examples():
    """Row 9 of (10, 10) under window (2, any right) sees keys 7..9: 7 left out; a window wider than the rows leaves
    none out; a chunk without a window is no window; a request without keys adds nothing."""
    for right in (None, 0, 3):
        assert field("keys_left_of_window", case(requests=((10, 10),), window=(2, right))) == 7
    assert field("keys_left_of_window", case(requests=((4, 4),), window=(5, None))) == 0
    assert field("keys_left_of_window", case(requests=((10, 10),), causal=True, chunk=4)) == 0
    assert field("keys_left_of_window", case(requests=((2, 0), (3, 3)), window=(5, None))) == 0


# ---------------------------------------------------------------------------------------------- FA2's seqlen_k
# The seqlen_k FA2 normalises a window against (attnfast._fa_common.fa2_kernel_window): ``max_seqlen_k`` for a
# varlen call; for flash_attn_with_kvcache the cache's width, ``mha_fwd_kvcache``'s ``seqlen_k``: the contiguous
# cache's length, or the block table's columns x the page size.  The oracle is the call attnfast.fa2 builds.


def fa2_call_seqlen_k(c: AttentionCase) -> int:
    """The ``seqlen_k`` of the FA2 call the adapter builds for ``c`` (flash_api.cpp: ``max_seqlen_k``; kvcache:
    ``kcache.size(1)``, paged ``max_num_blocks_per_seq * page_block_size``)."""
    kw = fa2_plan(c, make_inputs(c)).kwargs
    if fa2_entry(c) == VARLEN:
        return kw["max_seqlen_k"]
    if kw["block_table"] is None:
        return kw["k_cache"].shape[1]
    return kw["block_table"].shape[1] * c.block_size


PAGED = dict(kv_layout="NHD", block_size=256)


@pytest.mark.parametrize(
    ("c", "seqlen_k"),
    [
        (case(requests=((20, 300), (30, 17)), **PAGED), 300),  # varlen, paged: max_seqlen_k, not the table's reach
        (case(requests=((20, 0), (30, 0))), 0),  # varlen without keys
        (case(requests=((1, 300), (1, 17))), 300),  # decode: the contiguous cache holds the longest request
        (case(requests=((1, 3),), num_heads=8), 3),  # decode without append: no minimum width
        (case(requests=((1, 1), (1, 0))), 1),  # one key, or none: the cache is one key wide
        (case(requests=((1, 0),)), 1),
        (case(requests=((1, 3),), num_heads=8, append=True), 8),  # a one-token GQA append: ngroups keys
        (case(requests=((2, 2),), num_heads=8, append=True), 2),  # two tokens: no ngroups rule
        (case(requests=((1, 100),), **PAGED), 256),  # paged: whole pages
        (case(requests=((1, 300), (1, 0)), **PAGED), 512),
        (case(requests=((1, 0),), **PAGED), 256),  # a request without keys still owns one page
        (case(requests=((1, 3),), num_heads=32, append=True, kv_layout="HND", block_size=16), 32),  # 2 pages
    ],
)
def test_fa2_seqlen_k_is_the_width_of_the_call_fa2_makes(c, seqlen_k):
    """The seqlen_k of the varlen call (max_seqlen_k) and of the kvcache call (the cache's width in whole pages,
    widened for a one-token GQA append to ngroups keys), as attnfast.fa2 builds the call."""
    got = _fa2_seqlen_k(c)
    assert type(got) is int and got == seqlen_k == fa2_call_seqlen_k(c)


def test_fa2_seqlen_k_of_a_short_append_is_at_least_q_len():
    """An append of fewer new keys than query tokens into caches narrower than q_len (peer-fa2-kvcache on the H100:
    q_len 128 over 127 / 126 keys, append_len 126) gets a cache q_len wide (flash_api.cpp checks seqlen_q <=
    seqlen_k): seqlen_k is q_len, also paged (300 tokens over 256-key pages: two pages)."""
    short = case(requests=((128, 127), (128, 126)), append=True, append_len=126, head_dim=64)
    assert _fa2_seqlen_k(short) == 128 == fa2_call_seqlen_k(short)
    paged = case(requests=((300, 250),), append=True, append_len=200, head_dim=64, **PAGED)
    assert _fa2_seqlen_k(paged) == 512 == fa2_call_seqlen_k(paged)
    # a left-only window's right side becomes seqlen_k: q_len 10 over 5 keys (4 new) is called with a cache 10 wide,
    # right side 10 reaches every key from row 0 (seqlen_k 5 would cut rows 0..3: a misread the kernel never makes)
    wide = case(requests=((10, 5),), append=True, append_len=4, window=(1, None))
    assert _fa2_seqlen_k(wide) == 10 and field("fa2_window_misread", wide) is False


@st.composite
def fa2_cases(draw) -> AttentionCase:
    """Cases FA2 calls: varlen prefills, decodes and speculative decodes (one q_len <= 16), appends (short ones too),
    pinned splits; contiguous or paged (pages of 256, or 16 to reach a table's widening), GQA groups."""
    group = draw(st.sampled_from([1, 2, 8, 32]))
    kw = dict(num_heads=group, num_kv_heads=1, head_dim=32)
    if draw(st.booleans()):
        kw.update(kv_layout=draw(st.sampled_from(["NHD", "HND"])), block_size=draw(st.sampled_from([16, 256])))
    batch = draw(st.integers(1, 3))
    kind = draw(st.sampled_from(["varlen", "decode", "append", "short", "splits"]))
    if kind == "varlen":
        kw["requests"] = tuple(draw(st.tuples(st.integers(17, 40), st.integers(0, 300))) for _ in range(batch))
        return AttentionCase(**kw)
    q = draw(st.integers(1, 16)) if kind != "short" else draw(st.integers(2, 300))
    kw["requests"] = tuple((q, draw(st.integers(q if kind == "append" else 0, 300))) for _ in range(batch))
    if kind == "append":
        kw["append"] = True
    if kind == "short":
        new = draw(st.integers(1, q - 1))
        kw["requests"] = tuple((q, max(kl, new)) for _, kl in kw["requests"])
        kw.update(append=True, append_len=new)
    if kind == "splits":
        kw["num_splits"] = draw(st.integers(2, 4))
    return AttentionCase(**kw)


@given(fa2_cases())
@settings(max_examples=120)
def test_fa2_seqlen_k_is_the_seqlen_k_of_the_adapters_call(c):
    """Over varlen, decode, append, short-append and split calls, contiguous and paged: the ledger's seqlen_k is the
    one of the call attnfast.fa2 builds, so fa2_window_misread normalises against what the kernel is given."""
    assert _fa2_seqlen_k(c) == fa2_call_seqlen_k(c)


# ---------------------------------------------------------------------------------------------- FA2's entry, window
@pytest.mark.parametrize(
    ("c", "entry"),
    [
        (case(requests=((20, 30),)), "varlen"),
        (case(requests=((1, 30), (1, 3))), "kvcache"),
        (case(requests=((5, 30),), append=True), "kvcache"),
        (case(requests=((20, 30),), num_splits=2), "kvcache"),
    ],
)
def test_fa2_entry_names_the_entry_point_the_adapter_calls(c, entry):
    """``fa2_entry`` is "varlen" for flash_attn_varlen_func and "kvcache" for flash_attn_with_kvcache, the entry
    attnfast.fa2 picks (prefill; decode, append and pinned splits)."""
    assert field("fa2_entry", c) == entry
    assert fa2_entry(c) == {"varlen": VARLEN, "kvcache": KVCACHE}[entry]


@pytest.mark.parametrize("misread", ["fa2_window_misread", "fa2_varlen_window_misread"])
def test_a_causal_left_window_is_not_misread(misread):
    """Causal with a left window (w, None): FA2 forces the right side to 0 before normalising (a left side < seqlen_k
    stays), so the kernel applies the case's window: no misread, for sq <= sk and sq > sk alike; without causal the
    unbounded right side becomes seqlen_k, which misreads the top rows of sq > sk (issue 895)."""
    for requests in (((4, 4),), ((10, 4),), ((3, 30), (9, 6))):
        c = case(requests=requests, window=(2, None), causal=True)
        assert field(misread, c) is False, requests
    assert field(misread, case(requests=((10, 4),), window=(2, None))) is True


def test_the_views_of_a_case_and_of_its_json_in_any_key_order_are_one():
    """A record's case JSON, whatever its key order, and the case itself share one view: the fields of one case are
    computed once over a whole ledger run (``case_view`` caches by the case's sorted JSON)."""
    c = case(requests=((3, 5), (1, 2)), causal=True, window=(4, 0))
    data = c.to_json()
    view = case_view(c)
    assert view is not None and view.case == c
    assert case_view(data) is view
    assert case_view(dict(reversed(list(data.items())))) is view
    assert case_view({}) is None and case_view({"requests": "bad"}) is None


def test_the_case_fields_built_again_are_the_ledgers_first_ones() -> None:
    """``_case_fields`` called now (as a mutant of it would be) gives the first fields of ``FIELDS``, built at import:
    the same names in the same order, kinds, nullability, help texts, and the same value on a case."""
    # kills x__case_fields__mutmut_1..18, the mutants mutmut cannot see through FIELDS (built before it picks one)
    built = _case_fields()
    assert list(built) == list(FIELDS)[: len(built)] and len(built) > 20
    assert [(f.kind, f.nullable, f.help) for f in built.values()] == [
        (FIELDS[n].kind, FIELDS[n].nullable, FIELDS[n].help) for n in built
    ]
    assert any(f.nullable for f in built.values()) and all(f.help for f in built.values())
    assert {f.kind for f in built.values()} == {"int", "float", "bool", "str"}
    assert {"append_uneven", "min_new_kv_len", "max_new_kv_len", "graph_replays"} <= set(built)  # the tuples' scalars
    c = case(requests=((4, 30), (1, 9)), num_heads=4, num_kv_heads=2, causal=True, kv_layout="NHD", block_size=16)
    assert {n: f.get(c) for n, f in built.items()} == {n: FIELDS[n].get(c) for n in built}
