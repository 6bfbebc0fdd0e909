#!/usr/bin/env bash
# Sets everything up, then runs the whole test suite (no GPU needed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
