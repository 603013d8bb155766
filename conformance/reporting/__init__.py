"""Reading results: Markdown/HTML reports (:mod:`.report`, :mod:`.plots`, ``templates/``), the
known-failure ledgers (:mod:`.ledger`, data in ``conformance/ledgers/``) and upgrade diffs
(:mod:`.compare`)."""
