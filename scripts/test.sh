#!/usr/bin/env bash
# Run fiberrl's whole test suite, installing what it needs first.
# Extra arguments go to pytest (e.g. bash scripts/test.sh -k queue).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
# CPython's own multiprocessing conformance tests live in the interpreter's test
# package; Debian ships it separately.
if ! .venv/bin/python -c "import test._test_multiprocessing" 2>/dev/null; then
    ver=$(.venv/bin/python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    apt-get update -qq && apt-get install -y -qq "libpython${ver}-testsuite" >/dev/null || \
        echo "warning: CPython's test package is missing; conformance tests will be skipped" >&2
fi
# CPython's test_concurrent_futures (tests/test_concurrent_futures_suite.py): this
# interpreter's test package may lack it; Debian's libpython3.X-testsuite has it.
ver=$(.venv/bin/python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
if [ ! -f "/usr/lib/python${ver}/test/test_concurrent_futures.py" ] && \
   ! .venv/bin/python -c "import test.test_concurrent_futures" 2>/dev/null; then
    apt-get update -qq && apt-get install -y -qq "libpython${ver}-testsuite" >/dev/null || \
        echo "warning: test_concurrent_futures is missing; its runner will be skipped" >&2
fi
# Two test processes side by side (pytest-xdist): most tests wait on other processes
# (jobs starting, clusters scheduling, time limits) more than they use a core. The tests
# that share the Slurm cluster and dockerd run in one of them, one after the other, as
# do the fake Kubernetes server's (tests/side_by_side.py). FIBERRL_TEST_WORKERS=0 runs
# everything in one process.
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "${FIBERRL_TEST_WORKERS:-2}" \
    --dist loadgroup "$@"
