"""The numerical verdict: the fp32/fp64 reference of a case (:mod:`.reference`), the same-precision
baseline (:mod:`.baseline`), tolerances as data (:mod:`.tolerance`) and the check that turns one
kernel call into a :class:`~conformance.records.CheckResult` (:mod:`.check`); a case of several calls is judged
through its composition, named in :data:`.composition.COMPOSITIONS` (engines, graphs, invariance and backward sit
above the verdict and register there, imported on first use).

A new tolerance rule is a table entry in :mod:`.tolerance`; a new sub-check goes into :mod:`.check`.
"""
