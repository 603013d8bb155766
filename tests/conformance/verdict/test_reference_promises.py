"""The reference computes the case's own options (conformance/verdict/reference.py): every option field of an
``AttentionCase`` reaches ``attnref``.  A field dropped on the way would make the reference and the kernel compute
different functions for every case that sets it; mutmut found scale, chunk and context parallelism unchecked
here (docs "Mutation testing")."""

from __future__ import annotations

from attnref import AttnOptions, ContextParallel, Window
from conformance.cases.case import AttentionCase
from conformance.verdict.reference import case_options

CASE = AttentionCase(requests=((3, 8),), num_heads=2, num_kv_heads=1, head_dim=16, causal=True)


def test_every_option_field_reaches_the_reference() -> None:
    case = CASE.replace(scale=0.3, chunk=4, softcap=20.0, window=(5, None))
    assert case_options(case) == AttnOptions(causal=True, window=Window(5, None), softcap=20.0, scale=0.3, chunk=4)


def test_context_parallel_from_a_world_of_two() -> None:
    """The rank's shard (world, rank) goes to the reference; the per-sequence totals travel in the inputs."""
    assert case_options(CASE.replace(cp_world=2, cp_rank=1)).cp == ContextParallel(2, 1)
    assert case_options(CASE.replace(cp_world=4, cp_rank=3)).cp == ContextParallel(4, 3)
    assert case_options(CASE).cp is None
