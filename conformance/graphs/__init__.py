"""CUDA-graph mode and invariance verdicts (issue: verify the engines as they serve).

=====================  ===============================================================================
module                 concern
=====================  ===============================================================================
``buffers``            a bucket's static buffers and how each replay batch is written into them in place
``captured``           the capture / replay / compare loop every graph path uses (kernel and engines)
``replay``             kernel-level graph mode: capture on the bucket, replay every batch, judge each
``bitwise``            bit-for-bit comparison of two outputs (graph vs eager, invariances)
``assemble``           a call built from chosen requests of a case (the batches an invariance compares)
``invariance``         run-to-run, batch-composition and split-count invariances as verdicts
``suite``              suite ``graphs``: the graph and invariance cases engines' configurations need
=====================  ===============================================================================

A case opts in with ``AttentionCase.graph`` (replay batch sizes, capture first; ``graph_fill`` the padded
requests' key count) or ``AttentionCase.invariance``; :func:`conformance.verdict.check.composition_of` sends it
here.  An adapter takes part in graph mode by declaring the opt-in feature ``graph`` and implementing
:meth:`attnfast.base.Backend.prepare_graph`.
"""
