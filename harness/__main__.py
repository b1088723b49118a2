"""``python -m harness``: the ``harness`` command (:mod:`harness.cli.main`)."""

import sys

from harness.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
