"""Run each surviving mutant of the given name globs against whole test folders, and write the exit code back.

mutmut maps each function to the tests that ran it when its stats were collected, and later collects stats only for
new tests: a function added after the first run is mapped to the tests added with it alone.  This closes that gap
for the survivors.  From the project root, after ``MODE=stats python scripts/mutation/drive.py``::

    python scripts/mutation/recheck.py 'conformance.verdict.*' 'attnref.*'

``pytest -x -n 2``: exit code 1 is a failing test (killed), 0 a survivor; with xdist a failure under ``-x`` can
also end in 2 (interrupted), which needs a run without ``-n`` to tell from a collection error.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import subprocess
import sys
import time

from mutmut_results import exit_codes  # beside this script

#: the test folders each mutant prefix runs against (the line-count test breaks on mutmut's trampolines)
FOLDERS = {
    "attnref.": ["tests/attnref"],
    "conformance.verdict.": [
        "tests/conformance/verdict",
        "tests/conformance/graphs",
        "tests/conformance/backward",
        "tests/conformance/engines",
        "--ignore=tests/conformance/engines/test_layout.py",
    ],
    "conformance.ledger.": ["tests/conformance/ledger"],
    "conformance.records.": ["tests/conformance/ledger", "tests/conformance/running/test_oom_affinity.py"],
}


def main(globs: list[str]) -> None:
    subprocess.run(["cp", "-a", "tests/.", "mutants/tests/"], check=True)  # the tests as they are now
    for path in sorted(glob.glob("mutants/**/*.meta", recursive=True)):
        codes = exit_codes(path)
        todo = [k for k, v in codes.items() if v == 0 and any(fnmatch.fnmatch(k, g) for g in globs)]
        for name in todo:
            folders = next(d for prefix, d in FOLDERS.items() if name.startswith(prefix))
            t0 = time.time()
            rc = subprocess.call(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-x",
                    "-m",
                    "not slow",
                    "-n",
                    "2",
                    "-p",
                    "no:cacheprovider",
                    *folders,
                ],
                cwd="mutants",
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={**os.environ, "MUTANT_UNDER_TEST": name},
            )
            print(f"{name} rc {rc} {time.time() - t0:.0f}s", flush=True)
            with open(path) as f:
                meta = json.load(f)
            meta["exit_code_by_key"][name] = rc
            with open(path, "w") as f:
                json.dump(meta, f)


if __name__ == "__main__":
    main(sys.argv[1:])
