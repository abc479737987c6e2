#!/usr/bin/env bash
# Build nsqpy's wheel and sdist into dist/ with uv (found or installed as run.sh does), for
# `pip install dist/nsqpy-*.whl` wherever nsqpy is needed. Earlier builds' nsqpy files in
# dist/ are removed first, so that the glob names one wheel.
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
rm -f dist/nsqpy-*
say "building the sdist and the wheel (uv build)"
"${UV[@]}" build --quiet --out-dir dist
ls dist/nsqpy-*
