#!/usr/bin/env bash
# The whole test suite: lint, types, unit, end-to-end, Spark and browser tests on Python 3.11,
# and a fast subset (protocol, HTTP, client, the wheel, nsqpy.testing's sample project, one
# Spark test) on every other supported Python found on the machine (3.12, 3.13), each in its
# own venv (.venv-3.1x).
# CI runs exactly this (.ci/run). It installs what the tests need: the locked Python
# environments (uv), and Debian's Chromium for the nsqadmin browser tests when missing.
# Arguments go to the 3.11 pytest run; with arguments, the other versions are not run.
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
sync_env full
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing Debian's chromium package for the nsqadmin browser tests (apt-get, as root)"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "chromium is missing: install Debian's chromium package (the browser tests need it)" >&2
  fi
fi
export SPARK_LOCAL_IP=127.0.0.1
export NSQPY_UV="${UV[*]}"  # tests/e2e/test_wheel.py builds and installs the wheel with it
PYTEST=(pytest -q -p no:cacheprovider)
FAST_SUBSET=(
  tests/unit/test_wire_v2.py
  tests/e2e/test_protocol_errors.py
  tests/e2e/test_http_api.py
  tests/e2e/test_client.py
  tests/e2e/test_wheel.py
  tests/e2e/test_testing.py::test_sample_project_with_pynsq_passes_and_leaves_nothing
  tests/spark/test_sink.py::test_batch_write
)

# The interpreter for Python $1: pyenv's, else python$1 on PATH; nothing if absent.
find_python() {
  local candidate
  for candidate in "$(pyenv root 2>/dev/null)"/versions/"$1".*/bin/python"$1" "$(command -v "python$1")"; do
    if [ -x "$candidate" ] && "$candidate" -c 'import sys' >/dev/null 2>&1; then
      echo "$candidate"
      return
    fi
  done
}

# The sdist and wheel of every Python run, built first and at once (hatch_build.py compiles
# nsqd's hot modules with mypyc: one C file, one core, two minutes each), while ruff and mypy
# run: dist/test for 3.11 and dist/test-3.1x for the others. The fast subsets' wheel tests
# install them (NSQPY_DIST) instead of building their own.
declare -A PYTHONS=() BUILDS=()
# dist_of VERSION: where that version's sdist and wheel are built
dist_of() { if [ "$1" = 3.11 ]; then echo dist/test; else echo "dist/test-$1"; fi; }
if [ $# -eq 0 ]; then
  PYTHONS[3.11]="$PWD/.venv/bin/python"
  for version in 3.12 3.13; do
    python="$(find_python "$version")"
    if [ -n "$python" ]; then PYTHONS[$version]="$python"; fi
  done
  rm -rf dist/test dist/test-3.1* .venv-wheel
  mkdir -p dist
  for version in "${!PYTHONS[@]}"; do
    out="$(dist_of "$version")"
    echo "== building the sdist and the wheel (mypyc) for python $version into $out (in the background)"
    "${UV[@]}" build --quiet --python "${PYTHONS[$version]}" --out-dir "$out" >"$out.log" 2>&1 &
    BUILDS[$version]=$!
  done
fi
# wait_build VERSION: wait for that version's build; print its log if it failed.
wait_build() {
  local out
  out="$(dist_of "$1")"
  if ! wait "${BUILDS[$1]}"; then
    echo "== building for python $1 failed:"
    cat "$out.log"
    failed="${failed:+$failed, }$1 (wheel build)"
    failed_summary="FAILED: the wheel build for python $1"
  fi
}

echo "== ruff"; "${UV[@]}" run --frozen ruff check .
echo "== mypy"; "${UV[@]}" run --frozen mypy

ran=("3.11 ($([ $# -eq 0 ] && echo "spark and Spark faults" || echo "$*"))")
failed=""        # "<label> (exit <rc>), ..." of the failed subsets
failed_summary=""  # the last failed one's pytest summary line

# run_subset LABEL COMMAND...: run one subset's pytest, noting a failure (the 3.11 run's own
# summary line stays the last line printed).
run_subset() {
  local label="$1" log rc
  shift
  ran+=("$label")
  log="$(mktemp)"
  set +e
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  note_subset "$label" "$rc" "$log"
}

# note_subset LABEL RC LOG: note a subset's failure (its exit code, its summary line); removes LOG.
note_subset() {
  if [ "$2" -ne 0 ]; then
    failed="${failed:+$failed, }$1 (exit $2)"
    failed_summary="$(tail -n 1 "$3")"
  fi
  rm -f "$3"
}

# start_subset LABEL COMMAND...: run one subset's pytest in the background, its output kept
# for finish_subset (subsets whose tests mostly wait, on timers and other processes, share the
# two cores).
declare -A SUBSET_PIDS=() SUBSET_LOGS=()
start_subset() {
  local label="$1"
  shift
  echo "== pytest: $label (in the background)"
  ran+=("$label")
  SUBSET_LOGS[$label]="$(mktemp)"
  "$@" >"${SUBSET_LOGS[$label]}" 2>&1 &
  SUBSET_PIDS[$label]=$!
}

# finish_subset LABEL: wait for a subset start_subset started, print its output, note it.
finish_subset() {
  local rc=0
  wait "${SUBSET_PIDS[$1]}" || rc=$?
  echo "== pytest: $1"
  cat "${SUBSET_LOGS[$1]}"
  note_subset "$1" "$rc" "${SUBSET_LOGS[$1]}"
}

if [ $# -eq 0 ]; then
  # The fast subsets of 3.12 and 3.13 at once (much of their time is a JVM's and a venv's
  # start-up); their output is printed when they are done, 3.12's first. (A build whose
  # compiler fails, 35 s of mypy, is tried on 3.11 only.)
  started=()
  for version in 3.12 3.13; do
    python="${PYTHONS[$version]:-}"
    if [ -z "$python" ]; then
      echo "== python $version: no interpreter found, skipped"
      continue
    fi
    venv="$PWD/.venv-$version"
    UV_PROJECT_ENVIRONMENT="$venv" "${UV[@]}" sync --frozen --quiet --python "$python"
    wait_build "$version"
    start_subset "$version (fast subset)" \
      env PYSPARK_PYTHON="$venv/bin/python" PYSPARK_DRIVER_PYTHON="$venv/bin/python" \
      NSQPY_DIST="$PWD/$(dist_of "$version")" \
      "$venv/bin/python" -m "${PYTEST[@]}" -n 2 "${FAST_SUBSET[@]}" \
      --deselect tests/e2e/test_wheel.py::test_a_failed_compile_builds_the_pure_wheel
    started+=("$version (fast subset)")
  done
  for label in "${started[@]}"; do finish_subset "$label"; done

  # The 3.11 wheel installed alone in .venv-wheel: the protocol and differential tests run
  # against its servers as well (NSQPY_SERVER_PYTHON), and tests/e2e/test_wheel.py checks
  # what was built (NSQPY_DIST).
  wait_build 3.11
  echo "== installing the 3.11 wheel (mypyc) into .venv-wheel"
  "${UV[@]}" venv --quiet --python "$PWD/.venv/bin/python" .venv-wheel
  "${UV[@]}" pip install --quiet --compile-bytecode --python .venv-wheel/bin/python \
    dist/test/nsqpy-*.whl
  export NSQPY_DIST="$PWD/dist/test"
  COMPILED_SUBSET=(
    tests/differential
    tests/e2e/test_protocol_errors.py
    tests/e2e/test_tls.py
    tests/e2e/test_compression.py
    tests/e2e/test_delivery.py
    tests/e2e/test_durability.py
    tests/e2e/test_http_api.py
    tests/e2e/test_http_expect.py
    tests/e2e/test_http_limits.py
    tests/e2e/test_metrics.py
  )
  echo "== against the compiled wheel's nsqd: ${COMPILED_SUBSET[*]}"
  start_subset "the compiled wheel" \
    env NSQPY_SERVER_PYTHON="$PWD/.venv-wheel/bin/python" \
    .venv/bin/python -m "${PYTEST[@]}" -n 2 "${COMPILED_SUBSET[@]}"
  # nsqd --workers=2 (docs/SCALING.md), the compiled wheel's: the protocol, HTTP and
  # differential tests, unchanged (tests/support/procs.py adds the flag to every nsqd).
  WORKERS_SUBSET=(
    tests/differential
    tests/e2e/test_protocol_errors.py
    tests/e2e/test_delivery.py
    tests/e2e/test_http_api.py
    tests/e2e/test_tls.py
    tests/e2e/test_compression.py
    tests/e2e/test_policies.py
  )
  echo "== against nsqd --workers=2 (the compiled wheel's): ${WORKERS_SUBSET[*]}"
  start_subset "nsqd --workers=2" \
    env NSQPY_SERVER_PYTHON="$PWD/.venv-wheel/bin/python" NSQPY_NSQD_WORKERS=2 \
    .venv/bin/python -m "${PYTEST[@]}" -n 2 "${WORKERS_SUBSET[@]}"
  finish_subset "the compiled wheel"
  finish_subset "nsqd --workers=2"
fi

# Spark's Python workers must use this environment's interpreter (pyarrow), offline.
export PYSPARK_PYTHON="$PWD/.venv/bin/python" PYSPARK_DRIVER_PYTHON="$PWD/.venv/bin/python"
WHOLE=("$@")
SIDE=""  # the label of a run beside the last one (start_subset), if any
if [ $# -eq 0 ]; then
  echo "== pytest on python 3.11: unit, differential and end-to-end tests (2 workers)"
  run_subset "3.11 (unit/differential/e2e)" \
    .venv/bin/python -m "${PYTEST[@]}" -n 2 tests/unit tests/differential tests/e2e
  # Then the tests that share a machine-wide resource, one at a time, in two runs side by side
  # of about the same length (9-11 min on the 2-core CI machine): tests/spark (one Spark
  # session, one standalone cluster) with the Spark faults tests, and the other faults tests
  # (mounts, network namespaces, kill -9 timing), the docs and the browser tests.
  SPARK_FAULTS=(tests/faults/test_spark_disk_full.py tests/faults/test_spark_partitions.py)
  SIDE="3.11 (faults/docs/browser)"
  start_subset "$SIDE" .venv/bin/python -m "${PYTEST[@]}" tests/faults tests/docs tests/browser \
    "${SPARK_FAULTS[@]/#/--ignore=}"
  WHOLE=(tests/spark "${SPARK_FAULTS[@]}")
fi
echo "== python versions run: $(IFS=,; echo "${ran[*]}" | sed 's/,/, /g')"
echo "== pytest on python 3.11: ${WHOLE[*]:-the whole suite}"
# pytest exits 5 when nothing was collected: a suite that ran no test has failed.
set +e
"${UV[@]}" run --frozen "${PYTEST[@]}" "${WHOLE[@]}"
rc=$?
set -e
if [ -n "$SIDE" ]; then
  finish_subset "$SIDE"  # its summary line is the last one printed
fi
if [ -n "$failed" ]; then
  # the last line stays a pytest summary line: the failed version's
  echo "== failed besides the 3.11 run: $failed:"
  echo "$failed_summary"
  exit $(( rc != 0 ? rc : 1 ))
fi
exit $rc
