"""Known failures: the ledger entries and how they sort results (:mod:`.entries`), their predicates
(:mod:`.predicate`) over the case's own and derived fields (:mod:`.fields`), the audit of a results file against
them (:mod:`.audit`) and ``attnconf ledger`` (:mod:`.cli`); the data is ``conformance/ledgers/<backend>.toml``.

Below :mod:`conformance.running` (a run sorts its problems with the ledger) and above the suites (an entry matching
no case of the built-in suites is stale): ``docs/reference/layout.md`` has the layer order.
"""
