"""What each built-in backend needs on this machine, checked without using it.

``fiberrl backends`` and the commands that take ``--backend`` ask
:func:`missing_requirement` first, so a missing extra is one clear line naming the
install command, not an ``ImportError`` from deep inside a backend.
"""
from __future__ import annotations

import importlib.util
import logging
import shutil
from typing import Dict, Optional, Tuple

logger = logging.getLogger(__name__)

#: backend -> (Python modules it imports, the fiberrl extra that installs them)
PYTHON_EXTRAS: Dict[str, Tuple[Tuple[str, ...], str]] = {
    "docker": (("docker",), "docker"),
    "kubernetes": (("kubernetes",), "kubernetes"),
}
#: backend -> commands it runs
COMMANDS: Dict[str, Tuple[str, ...]] = {
    "slurm": ("sbatch", "squeue", "scancel"),
}


def missing_requirement(name: str) -> Optional[str]:
    """Why backend ``name`` cannot be used here (what to install), or None."""
    modules, extra = PYTHON_EXTRAS.get(name, ((), ""))
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        return (f"the {name} backend needs the {', '.join(missing)} Python package: "
                f"pip install 'fiberrl[{extra}]' (or bash scripts/install.sh {extra})")
    commands = [c for c in COMMANDS.get(name, ()) if shutil.which(c) is None]
    if commands:
        return (f"the {name} backend needs Slurm's commands ({', '.join(commands)} not on PATH); "
                "bash scripts/slurm-up.sh starts a test cluster on this machine")
    return None
