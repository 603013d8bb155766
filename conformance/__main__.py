"""``python -m conformance``: the same command line as ``attnconf``."""

import sys

try:
    from conformance.cli import main
except KeyboardInterrupt:  # Ctrl-C before main() could catch it: nothing ran yet, nothing to resume
    print("attnconf: interrupted (Ctrl-C)", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
