"""``python -m rl``: see :mod:`rl.cli`."""
import sys

from rl.cli import run

if __name__ == "__main__":
    sys.exit(run())
