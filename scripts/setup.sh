#!/usr/bin/env bash
# Sets up everything Benanza needs on a fresh Debian/Ubuntu machine: system packages
# (compilers, CMake, Google Benchmark, oneDNN, headless Chromium), a virtualenv in .venv
# with the package and its test extras, and the cuDNN/cuBLAS wheels the GPU backend
# compiles against. Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(cmake ninja-build g++ make libbenchmark-dev libdnnl-dev chromium libssh-4)
if command -v apt-get >/dev/null 2>&1; then
  missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi

# Nsight Systems (Debian non-free) for `benanza profile --nsys` and .nsys-rep parsing.
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] && ! command -v nsys >/dev/null 2>&1; then
  bash scripts/install-nsys.sh || echo "setup: Nsight Systems not installed; nsys tests will skip" >&2
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test,cuda,serve]"
.venv/bin/python -m pip install -q "torch==2.13.0" || echo "setup: torch not installed; torch profile tests will skip" >&2
