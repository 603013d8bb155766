"""The named suites (``attnconf run --suite NAME``): :mod:`.registry` assembles :data:`~.registry.SUITES` from the
sweeps by family (:mod:`.smoke`, :mod:`.default`, :mod:`.full`, :mod:`.perf` the timing cases, :mod:`.backward`
the backward sweeps and covering array), the fuzzer's findings (:mod:`.found`), the limits probes (:mod:`.limits`),
real models' configurations (:mod:`.models`), the kernels' own test grids (:mod:`.peers`) and the suites of the
compositions below (engines, graphs, training); :mod:`.cache` keeps built case lists on disk; :mod:`.descriptions`
holds a line per suite, torch-free, for ``--help`` and ``attnconf suites``.

Above the case model and the compositions (it imports them to assemble their suites), below ``running/`` (which
selects from them): ``docs/reference/layout.md`` has the layer order.  This ``__init__`` imports nothing, so that
:mod:`.descriptions` stays torch-free.  A new suite: one entry in :data:`~.registry.SUITES` and its line in
:data:`~.descriptions.SUITE_DESCRIPTIONS`; a new sweep: one entry in its family's module.
"""
