#!/usr/bin/env bash
# Install the whole development environment in .venv (what ./scripts/test.sh installs, without
# running anything): pytest, the third-party clients the tests drive, pyspark, pyarrow,
# playwright, py-spy. Needed for the benchmarks, the Spark connector and running tests by hand.
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
sync_env full
say "ready: .venv/bin/python, .venv/bin/pytest"
