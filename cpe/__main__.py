"""``python -m cpe``: see :mod:`cpe.cli`."""

import sys

from cpe.cli import run

if __name__ == "__main__":
    sys.exit(run())
