"""Test configuration for the cpe suite."""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


def pytest_configure(config):
    """Register the ``slow`` marker used by long-running statistical checks."""
    config.addinivalue_line("markers", "slow: long-running statistical check (deselect with -m 'not slow')")
