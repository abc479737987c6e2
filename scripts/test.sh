#!/usr/bin/env bash
# The whole test suite: lint, types, unit, end-to-end, Spark and browser tests.
# CI runs exactly this (.ci/run). It installs what the tests need: the locked Python
# environment (uv), and Debian's Chromium for the nsqadmin browser tests when missing.
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing chromium (Debian) for the browser tests"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "chromium is missing: install Debian's chromium package (the browser tests need it)" >&2
  fi
fi
# Spark's Python workers must use this environment's interpreter (pyarrow), offline.
export PYSPARK_PYTHON="$PWD/.venv/bin/python" PYSPARK_DRIVER_PYTHON="$PWD/.venv/bin/python"
export SPARK_LOCAL_IP=127.0.0.1
echo "== ruff"; "${UV[@]}" run --frozen ruff check .
echo "== mypy"; "${UV[@]}" run --frozen mypy
echo "== pytest"
# pytest exits 5 when nothing was collected: a suite that ran no test has failed.
exec "${UV[@]}" run --frozen pytest -q -p no:cacheprovider "$@"
