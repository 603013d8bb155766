"""Running sweeps: the crash-isolated worker process (:mod:`.worker`; the parent's side :mod:`.worker_client`),
the options of ``attnconf run`` (:mod:`.run_args`), the resumable runner that
writes JSONL (:mod:`.runner`, its pieces in :mod:`.pairs`), its parallel workers and their GPU placement
(:mod:`.pool`), the environment header of a run (:mod:`.env`), case selection (:mod:`.selection`), the
results file's sweep identity, resume checks and backups (:mod:`.outfile`), the end-of-run summary and exit
status (:mod:`.outcome`) and usage errors (:mod:`.usage`)."""
