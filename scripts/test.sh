#!/usr/bin/env bash
# The whole test suite: lint, types, unit, end-to-end. CI runs exactly this (.ci/run).
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
echo "== ruff"; "${UV[@]}" run --frozen ruff check .
echo "== mypy"; "${UV[@]}" run --frozen mypy
echo "== pytest"
set +e
"${UV[@]}" run --frozen pytest -q -p no:cacheprovider "$@"
code=$?
set -e
# pytest exits 5 when nothing was collected: a suite that ran no test has failed.
exit $code
