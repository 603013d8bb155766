"""``python -m conformance.cli``: the same as ``attnconf`` (and ``python -m conformance``)."""

import sys

from conformance.cli import main

sys.exit(main())
