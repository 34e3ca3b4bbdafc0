"""``python -m fiberrl.backends.local CONTROL_FD [MODULE...]``: the local fork server.

An entry point of its own (the package imports :mod:`.forkserver`, so running that
module with ``-m`` would import it twice)."""
from .forkserver import main

if __name__ == "__main__":
    main()
