"""``python -m fiberrl.cli``: the ``fiberrl`` command."""
import sys

from . import main

sys.exit(main())
