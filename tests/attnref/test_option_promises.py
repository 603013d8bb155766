"""Promises of attnref/options.py the other tests left unchecked (mutmut found them: docs "Mutation testing"):
integer fields take integers only (no float, no bool), a shard length needs the total, per-sequence
context-parallel totals come with ``options.cp`` and only with it, both window extents are checked, the ranges of
soft-cap and chunk start where the docstrings say, and each refusal is one whole line naming the field."""

from __future__ import annotations

import re

import pytest

from attnref import AttnOptions, ContextParallel, Window
from attnref.varlen import cp_sequence_options


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((2.5, 0), r"cp\.world must be an int >= 2, got 2\.5"),
        ((4, True), r"cp\.rank must be an int in \[0, 4\), got True"),
        ((4, 1.0), r"cp\.rank must be an int in \[0, 4\), got 1\.0"),
        ((2, 0, 7.0), r"cp\.total must be an int >= 0 or None, got 7\.0"),
    ],
)
def test_context_parallel_takes_integers_only(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ContextParallel(*args)


def test_shard_length_needs_the_total() -> None:
    assert ContextParallel(2, 1, 7).local_len() == 3  # absolute keys 1, 3, 5
    with pytest.raises(ValueError, match=r"^cp\.total must be set \(the sequence's keys over all ranks\)$"):
        ContextParallel(2, 1).local_len()


@pytest.mark.parametrize(
    ("options", "totals", "message"),
    [
        (AttnOptions(causal=True), [8], "cp_tot_seqused_k is given but options.cp is None (no context parallelism)"),
        (
            AttnOptions(causal=True, cp=(2, 0)),
            None,
            "cp_tot_seqused_k must be given with options.cp (each sequence's keys over all ranks)",
        ),
    ],
)
def test_context_parallel_totals_come_with_cp_and_only_with_it(options, totals, message: str) -> None:
    """The whole message, as one line: it names the argument and what it needs."""
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        cp_sequence_options(options, [4], totals)


def test_window_checks_the_right_extent_when_the_left_is_unbounded() -> None:
    with pytest.raises(ValueError, match=r"window\.right must be >= 0"):
        Window(None, -1)


def test_negative_window_refusal_says_how_to_convert() -> None:
    message = (
        "window.left must be >= 0 or None (unbounded), got -1; "
        "use attnref.mask.window_from_fa2 to convert FA2/FA3's -1 spelling"
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        Window(-1, None)


def test_smallest_positive_softcap_and_chunk_are_accepted() -> None:
    """Any positive finite soft-cap (below 1 too) and any chunk >= 1 are valid."""
    assert AttnOptions(softcap=0.5).softcap == 0.5
    assert AttnOptions(chunk=1).chunk == 1


def test_context_parallel_without_causal_is_refused_in_one_line() -> None:
    message = (
        "cp needs causal=True and no window or chunk (the kernel applies cp_* in its causal mask only), "
        "got causal=False, window=Window(left=None, right=None), chunk=None"
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        AttnOptions(cp=(2, 0))
