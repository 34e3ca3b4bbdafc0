#!/usr/bin/env bash
# Install fiberrl into ./.venv (on a fresh Debian machine too). Extras as arguments:
#   bash scripts/install.sh            # the core
#   bash scripts/install.sh test       # the core plus what the test suite needs
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! command -v "$PYTHON" >/dev/null || ! "$PYTHON" -c "import venv, ensurepip" 2>/dev/null; then
    echo "installing python3 and python3-venv from Debian's packages" >&2
    apt-get update -qq && apt-get install -y -qq python3 python3-venv >/dev/null
    PYTHON=python3
fi
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
extras=""
if [ $# -gt 0 ]; then extras="[$(IFS=,; echo "$*")]"; fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -c constraints.txt -e ".${extras}"
