# Shared by run.sh and test.sh: make sure uv is there and the locked environment is synced.
# Python 3.11 is the only prerequisite; uv comes from PyPI, everything else from uv.lock.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export UV_PYTHON_DOWNLOADS=never
if command -v uv >/dev/null 2>&1; then
  UV=(uv)
else
  # The absolute path: later steps put a venv's python3 first on PATH, which has no uv
  # (tests/e2e/test_wheel.py runs "$NSQPY_UV build" from inside the 3.11 venv).
  python="$(python3 -c 'import sys; print(sys.executable)')"
  if ! "$python" -m uv --version >/dev/null 2>&1; then
    "$python" -m pip install --quiet --disable-pip-version-check "uv==0.13.9"
  fi
  UV=("$python" -m uv)
fi
"${UV[@]}" sync --frozen --quiet --python "$(command -v python3.11 || command -v python3)"
# Bytecode for the environment and nsqpy, written once here: where PYTHONDONTWRITEBYTECODE
# is set, nothing else writes it, and every nsqd (each test's too) would compile aiohttp and
# nsqpy from source again, twice the CPU of a start-up (bench/run_shapes.py measures it).
.venv/bin/python -m compileall -q -j 0 nsqpy \
  "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  >/dev/null 2>&1 || true
