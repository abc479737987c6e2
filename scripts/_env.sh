# Shared by run.sh and test.sh: make sure uv is there and the locked environment is synced.
# Python 3.11 is the only prerequisite; uv comes from PyPI, everything else from uv.lock.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export UV_PYTHON_DOWNLOADS=never
if command -v uv >/dev/null 2>&1; then
  UV=(uv)
else
  if ! python3 -m uv --version >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check "uv==0.13.9"
  fi
  UV=(python3 -m uv)
fi
"${UV[@]}" sync --frozen --quiet --python "$(command -v python3.11 || command -v python3)"
