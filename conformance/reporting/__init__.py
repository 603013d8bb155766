"""Reading results: Markdown/HTML reports (:mod:`.report`, :mod:`.plots`, ``templates/``), upgrade diffs
(:mod:`.compare`) and shard merging (:mod:`.shards`, :mod:`.shard_parts`)."""
