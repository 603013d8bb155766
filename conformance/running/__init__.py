"""Running sweeps: the crash-isolated worker process (:mod:`.worker`), the resumable runner that
writes JSONL (:mod:`.runner`) and the environment header of a run (:mod:`.env`)."""
