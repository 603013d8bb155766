"""``attnconf fuzz``: random cases from the whole case space, each failure shrunk to a minimal case, failures
grouped by the axis values their minimal cases share.

* :mod:`~conformance.fuzz.draw`: the seeded stream of random cases (levels from :mod:`conformance.cases.space`,
  values beyond them);
* :mod:`~conformance.fuzz.shrink`: greedy, domain-aware shrinking of one failing (case, backend);
* :mod:`~conformance.fuzz.group`: failures grouped by the space's axis values of their minimal cases;
* :mod:`~conformance.fuzz.campaign`: the campaign loop (crash-isolated worker, budget, shrinking);
* :mod:`~conformance.fuzz.config`: the budget, the configuration and the summary of a campaign;
* :mod:`~conformance.fuzz.persist`: its records, resume and the example database of minimal cases;
* :mod:`~conformance.fuzz.cli`: the ``attnconf fuzz`` subcommand.
"""
