"""The backward pass (issue 20): backward cases judged on their gradients, and training-style batches.

One feature, one module: :mod:`.composition` (the composition of a backward case, dispatched from
:func:`conformance.verdict.check.composition_of`), :mod:`.gradients` (reference and same-precision baseline
gradients), :mod:`.verdict` (the per-tensor judgement and its tolerance), :mod:`.table` (the report's Backward
section), :mod:`.diff` (``attnconf compare``'s gradient diffs), :mod:`.packing` (training-style packed batches).
Nothing is imported here, so importing one module does not pull in the others.
"""
