#!/usr/bin/env bash
# Prepares the offline bundle scripts/gpu-validate.sh installs from (docs/gpu.md). Run it on a
# connected machine with the GPU machine's Debian/Ubuntu release, CPU architecture and Python
# minor version, then copy the folder next to the repository on the GPU machine.
#
#   scripts/gpu-prepare.sh [--out DIR] [--dry-run]
#
#   DIR/wheels  Benanza's dependencies with the test, cuda and serve extras, torch 2.13.0 (its
#               PyPI build bundles the CUDA libraries) and the build backend (pip download)
#   DIR/debs    cmake, ninja, g++, make, Google Benchmark and everything they depend on
#               (apt-get download of the apt-cache dependency closure); with NVIDIA's CUDA apt
#               repository configured, also nvcc, the CUDA runtime headers, compute-sanitizer
#               and CUPTI (the cuda-*-13-0 packages)
#
# --dry-run prints what would be downloaded and downloads nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=gpu-bundle
DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-prepare: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-python3}
WHEELS=(".[test,cuda,serve]" "torch==2.13.0" hatchling editables pip setuptools wheel)
DEBS=(cmake ninja-build g++ make libbenchmark-dev)
CUDA_DEBS=(cuda-nvcc-13-0 cuda-cudart-dev-13-0 cuda-sanitizer-13-0 cuda-cupti-dev-13-0 cuda-nvrtc-dev-13-0)

command -v apt-cache >/dev/null 2>&1 || { echo "gpu-prepare: needs apt-cache/apt-get (Debian or Ubuntu)" >&2; exit 3; }
have_candidate() { apt-cache show --no-all-versions "$1" >/dev/null 2>&1; }

wanted=("${DEBS[@]}")
if have_candidate "${CUDA_DEBS[0]}"; then
  wanted+=("${CUDA_DEBS[@]}")
else
  echo "gpu-prepare: NVIDIA's CUDA apt repository is not configured here: no CUDA toolkit .debs; the GPU machine needs its own CUDA 12/13 toolkit (nvcc, compute-sanitizer)" >&2
fi
# The closure, keeping only packages with a candidate to download (virtual ones have none).
mapfile -t names < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
                       --no-replaces --no-enhances "${wanted[@]}" | grep -E '^[a-z0-9]' | sort -u)
mapfile -t closure < <(apt-cache show --no-all-versions "${names[@]}" 2>/dev/null | sed -n 's/^Package: //p' | sort -u)
echo "gpu-prepare: ${#closure[@]} .debs for ${wanted[*]}" >&2

if [ "$DRY" = 1 ]; then
  printf 'wheel: %s\n' "${WHEELS[@]}"
  printf 'deb: %s\n' "${closure[@]}"
  exit 0
fi
mkdir -p "$OUT/wheels" "$OUT/debs"
"$PY" -m pip download -q -d "$OUT/wheels" "${WHEELS[@]}"
(cd "$OUT/debs" && apt-get download -q "${closure[@]}")
echo "gpu-prepare: $(ls "$OUT/wheels" | wc -l) wheels, $(ls "$OUT/debs" | wc -l) .debs in $OUT; copy it to the GPU machine and run scripts/gpu-validate.sh --bundle $OUT" >&2
