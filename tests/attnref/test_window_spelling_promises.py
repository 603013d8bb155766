"""Promises of the window spelling conversions (attnref/mask.py) that the identity tests left unchecked
(mutmut found them: README "Mutation testing")."""

from __future__ import annotations

from attnref import Window, window_to_fa4


def test_fa4_window_is_not_causal_unless_asked() -> None:
    """``window_to_fa4(window)`` keeps the window's right extent: causality is opt-in, as in FA4's API."""
    assert window_to_fa4(Window(3, 5)) == (3, 5)
    assert window_to_fa4(Window(None, None)) == (None, None)
    assert window_to_fa4(Window(3, 5), causal=True) == (3, 0)
