#!/usr/bin/env bash
# Sets everything up, then runs the whole test suite (no GPU needed).
#   bash scripts/test.sh [PYTEST ARGS]          everything (what CI and the README run)
#   bash scripts/test.sh --fast [PYTEST ARGS]   the unit layer for the edit loop: no C++ builds,
#       no framework runs end to end (the tests marked `slow`); sets up only when .venv is missing
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fast" ]; then
  shift
  [ -x .venv/bin/python ] || bash scripts/setup.sh
  exec .venv/bin/python -m pytest -q -m "not slow" "$@"
fi
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
