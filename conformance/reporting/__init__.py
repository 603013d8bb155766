"""Reading results: Markdown/HTML reports (:mod:`.report`, :mod:`.plots`, ``templates/``), the
known-failure ledgers (:mod:`.ledger`, data in ``conformance/ledgers/``), upgrade diffs
(:mod:`.compare`) and shard merging (:mod:`.shards`, :mod:`.shard_parts`)."""
