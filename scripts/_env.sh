# Shared by run.sh, dev_env.sh and test.sh: find uv (or install it once, into .venv-uv/),
# then `sync_env broker|full` brings .venv to uv.lock. Python 3.11 is the only prerequisite.
#   broker: nsqpy and what the servers, tools and client need (aiohttp, cramjam, uvloop);
#           --inexact: whatever else is installed (the full set) stays, so that a later
#           test.sh does not reinstall it
#   full:   everything the tests, benchmarks and the Spark connector need (the dev group)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export UV_PYTHON_DOWNLOADS=never

say() { echo "== $*"; }

# The absolute path of python: later steps put a venv's python3 first on PATH, which has no uv
# (tests/e2e/test_wheel.py runs "$NSQPY_UV build" from inside the 3.11 venv).
BASE_PYTHON="$(command -v python3.11 || command -v python3)"
BASE_PYTHON="$("$BASE_PYTHON" -c 'import sys; print(sys.executable)')"
if uv --version >/dev/null 2>&1; then
  UV=(uv)
elif "$BASE_PYTHON" -m uv --version >/dev/null 2>&1; then
  UV=("$BASE_PYTHON" -m uv)
else
  # pip --target: uv goes into this checkout, not into the system's interpreter
  if [ ! -x .venv-uv/bin/uv ]; then
    say "installing uv 0.13.9 from PyPI into .venv-uv/ (once)"
    "$BASE_PYTHON" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
      --target .venv-uv "uv==0.13.9"
  fi
  UV=("$PWD/.venv-uv/bin/uv")
fi

sync_env() {
  if [ "$1" = broker ]; then
    say "syncing .venv with uv.lock: nsqpy and the servers' dependencies (uv sync --no-dev --inexact)"
    "${UV[@]}" sync --frozen --no-dev --inexact --python "$BASE_PYTHON"
  else
    say "syncing .venv with uv.lock: everything the tests need, pyspark and playwright included (uv sync)"
    "${UV[@]}" sync --frozen --quiet --python "$BASE_PYTHON"
  fi
  # Bytecode for the environment and nsqpy, written once here: where PYTHONDONTWRITEBYTECODE
  # is set, nothing else writes it, and every nsqd (each test's too) would compile aiohttp and
  # nsqpy from source again, twice the CPU of a start-up (bench/run_shapes.py measures it).
  # site-packages only when it changed since the last time (its mtime moves with every
  # install or removal), as checking it all takes seconds.
  local purelib stamp=.venv/.bytecode-compiled
  purelib="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  if [ ! -e "$stamp" ] || [ "$purelib" -nt "$stamp" ]; then
    say "compiling bytecode of the installed packages"
    .venv/bin/python -m compileall -q -j 0 "$purelib" >/dev/null 2>&1 || true
    touch "$stamp"
  fi
  .venv/bin/python -m compileall -q -j 0 nsqpy >/dev/null 2>&1 || true
}
