"""Running sweeps: the crash-isolated worker process (:mod:`.worker`), the resumable runner that
writes JSONL (:mod:`.runner`), its parallel workers and their GPU placement (:mod:`.pool`) and the
environment header of a run (:mod:`.env`)."""
