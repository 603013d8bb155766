"""``python -m conformance``: the same command line as ``attnconf``."""

import sys

from conformance.cli import main

sys.exit(main())
