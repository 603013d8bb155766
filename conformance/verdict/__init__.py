"""The numerical verdict: the fp32/fp64 reference of a case (:mod:`.reference`), the same-precision
baseline (:mod:`.baseline`), tolerances as data (:mod:`.tolerance`) and the check that turns one
kernel call into a :class:`~conformance.records.CheckResult` (:mod:`.check`).

A new tolerance rule is a table entry in :mod:`.tolerance`; a new sub-check goes into :mod:`.check`.
"""
