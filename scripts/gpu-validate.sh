#!/usr/bin/env bash
# Validates Benanza's GPU path end to end on a Linux machine with an NVIDIA GPU and no network
# (docs/gpu.md): driver and device → offline install from a bundle prepared by
# scripts/gpu-prepare.sh → every cuDNN/cuBLAS family on a smoke model under compute-sanitizer
# → the benchmark campaign of ResNet50-v1, Inception-v1, MobileNet-v2 (and a transformer
# encoder when Benanza can process it) → PyTorch-on-CUDA profiles with cuDNN/cuBLAS logs →
# analysis → perfdb/<gpu>.db and docs/results-<gpu>.md.
#
#   scripts/gpu-validate.sh [--bundle DIR] [--out DIR] [--dry-run]
#
# --dry-run runs every step that needs no GPU (models, processability of the transformer,
# generating the smoke and campaign sources) and prints the GPU steps instead of running them;
# it works on any machine. Without it, a machine without an NVIDIA driver stops at the preflight
# with one line and exit status 3.
set -euo pipefail
cd "$(dirname "$0")/.."

BUNDLE=${BENANZA_GPU_BUNDLE:-gpu-bundle}
OUT=out/gpu-validate
DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) BUNDLE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-validate: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

MODELS=(resnet50-v1 inception-v1 mobilenet-v2)
START=$(date +%s)
say() { printf 'gpu-validate: [%4ds] %s\n' "$(( $(date +%s) - START ))" "$*" >&2; }
die() { local code=$1; shift; printf 'gpu-validate: %s\n' "$*" >&2; exit "$code"; }
# GPU steps: run, or (dry run) print.
exec 3>&2  # the log, also while a step's own output is redirected
gpu() { if [ "$DRY" = 1 ]; then { printf 'gpu-validate: would run:'; printf ' %q' "$@"; echo; } >&3; else "$@"; fi; }
find_tool() {  # PATH first, then the CUDA toolkit
  command -v "$1" 2>/dev/null || { [ -x "/usr/local/cuda/bin/$1" ] && echo "/usr/local/cuda/bin/$1"; } || true
}

# --- preflight ------------------------------------------------------------------------------
SMI=$(find_tool nvidia-smi)
GPU_NAME=""
if [ -z "$SMI" ]; then
  [ "$DRY" = 1 ] || die 3 "no NVIDIA driver: nvidia-smi not found; this kit needs a machine with an NVIDIA GPU (docs/gpu.md)"
  say "preflight: no NVIDIA driver (nvidia-smi not found): a real run stops here (exit 3); dry run goes on"
else
  GPU_NAME=$("$SMI" --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)
  if [ -z "$GPU_NAME" ]; then
    [ "$DRY" = 1 ] || die 3 "nvidia-smi lists no GPU: $("$SMI" -L 2>&1 | head -n 1)"
    say "preflight: nvidia-smi lists no GPU"
  else
    say "preflight: $("$SMI" --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | head -n 1)"
  fi
fi
SLUG=$(printf '%s' "${GPU_NAME:-no-gpu}" | tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' '-' | sed 's/^-//; s/-$//')
DB=perfdb/$SLUG.db
RESULTS=docs/results-$SLUG.md
NVCC=$(find_tool nvcc)
SANITIZER=$(find_tool compute-sanitizer)
if [ "$DRY" = 0 ]; then
  [ -n "$NVCC" ] || die 3 "no nvcc (CUDA toolkit) on PATH or in /usr/local/cuda/bin (docs/gpu.md: what the machine needs)"
  [ -n "$SANITIZER" ] || die 3 "no compute-sanitizer on PATH or in /usr/local/cuda/bin"
fi
say "preflight: nvcc ${NVCC:-missing}, compute-sanitizer ${SANITIZER:-missing}, bundle $BUNDLE"

# --- offline install --------------------------------------------------------------------------
need_debs=()
for tool in cmake ninja g++; do command -v "$tool" >/dev/null 2>&1 || need_debs+=("$tool"); done
[ -f /usr/include/benchmark/benchmark.h ] || need_debs+=(libbenchmark-dev)
if [ ${#need_debs[@]} -gt 0 ]; then
  [ -d "$BUNDLE/debs" ] || die 4 "missing ${need_debs[*]} and no $BUNDLE/debs to install them from (run scripts/gpu-prepare.sh on a connected machine)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  say "installing ${#need_debs[@]} missing tools from $BUNDLE/debs"
  gpu $SUDO dpkg -i --skip-same-version "$BUNDLE"/debs/*.deb
fi
PY=${BENANZA_PYTHON:-$PWD/.venv/bin/python}  # an interpreter with Benanza installed
if [ ! -x "$PY" ]; then
  [ -d "$BUNDLE/wheels" ] || die 4 "no .venv and no $BUNDLE/wheels to install it from (run scripts/gpu-prepare.sh on a connected machine)"
  say "installing Benanza and its wheels offline from $BUNDLE/wheels"
  python3 -m venv .venv
  .venv/bin/pip install -q --no-index --find-links "$BUNDLE/wheels" -e ".[test,cuda,serve]" "torch==2.13.0"
  PY=$PWD/.venv/bin/python
fi
BZ=$(dirname "$PY")/benanza
if [ "$DRY" = 0 ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  die 3 "PyTorch does not see the GPU (torch.cuda.is_available() is False): driver too old for CUDA 13?"
fi
mkdir -p "$OUT" perfdb docs

# --- models -----------------------------------------------------------------------------------
say "models: ${MODELS[*]}"
only=(); for m in "${MODELS[@]}"; do only+=(--only "$m"); done
"$BZ" zoo --out "$OUT/models" "${only[@]}" >/dev/null 2>&1
paths=(); for m in "${MODELS[@]}"; do paths+=("$OUT/models/$m.onnx"); done

# A transformer encoder (2 layers, d_model 256, 4 heads, sequence 64) exported by PyTorch: in
# the campaign only if Benanza processes it; otherwise the run and the results say why.
TRANSFORMER_NOTE=""
"$PY" - "$OUT/models/transformer-encoder.onnx" <<'PYEOF'
import sys, warnings
import torch
warnings.simplefilter("ignore")
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, batch_first=True)
encoder = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
torch.onnx.export(encoder, (torch.randn(1, 64, 256),), sys.argv[1], input_names=["x"], output_names=["y"],
                  opset_version=17, dynamo=False)
PYEOF
if probe=$("$BZ" generate "$OUT/models/transformer-encoder.onnx" --out "$OUT/probe" --backend none 2>&1); then
  MODELS+=(transformer-encoder); paths+=("$OUT/models/transformer-encoder.onnx")
  say "models: the transformer encoder is processable: in the campaign"
else
  reason=$(printf '%s\n' "$probe" | grep -m1 -i '^error: ' | cut -d' ' -f2- || true)
  TRANSFORMER_NOTE="transformer encoder (PyTorch nn.TransformerEncoder export): not processable by Benanza yet, so not in the campaign: ${reason:-$(printf '%s\n' "$probe" | tail -n 1)}"
  say "models: $TRANSFORMER_NOTE"
fi

# --- smoke: every family under compute-sanitizer ------------------------------------------------
say "smoke: every cuDNN/cuBLAS family (f32, f16) on the test suite's every-family model"
"$PY" - "$OUT/smoke.onnx" <<'PYEOF'
import sys
sys.path[:0] = ["tests"]
import onnx
from test_cudnn import every_family_model
onnx.save(every_family_model(), sys.argv[1])
PYEOF
"$BZ" generate "$OUT/smoke.onnx" --out "$OUT/smoke" --backend cudnn --dtype f32 --dtype f16 >/dev/null
smoke_bin=$OUT/smoke/cudnn/build/benanza_bench
gpu cmake -S "$OUT/smoke/cudnn" -B "$OUT/smoke/cudnn/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="${NVCC:-nvcc}"
gpu cmake --build "$OUT/smoke/cudnn/build" -j "$(nproc)"
# One call per repetition (BENANZA_TARGET_MS tiny): the sanitizer checks every call, it need not time them.
gpu env BENANZA_TARGET_MS=0.001 timeout 600 "${SANITIZER:-compute-sanitizer}" --tool memcheck --error-exitcode 99 \
  --print-limit 50 --log-file "$OUT/smoke-sanitizer.log" "$smoke_bin" --benchmark_repetitions=1 \
  > "$OUT/smoke.log" 2>&1 || { rc=$?; [ "$DRY" = 1 ] || { tail -n 20 "$OUT/smoke.log" "$OUT/smoke-sanitizer.log" >&2; die 5 "smoke run under compute-sanitizer failed (exit $rc): $OUT/smoke-sanitizer.log"; }; }
if [ "$DRY" = 0 ]; then
  cat "$OUT/smoke-sanitizer.log" >> "$OUT/smoke.log"
  want=$("$smoke_bin" --benanza_list | wc -l)
  got=$(grep -c '^BENANZA_RESULT ' "$OUT/smoke.log" || true)
  [ "$got" = "$want" ] || die 5 "smoke: $got of $want benchmarks reported ($OUT/smoke.log)"
  say "smoke: $got benchmarks reported, compute-sanitizer clean"
fi

# --- campaign -----------------------------------------------------------------------------------
say "campaign: generating the cuDNN/cuBLAS benchmarks of ${MODELS[*]}"
"$BZ" generate "${paths[@]}" --out "$OUT/bench" --backend cudnn >/dev/null
say "campaign: $("$PY" -c "import sys; from benanza.generator import read_variants; print(len(read_variants(sys.argv[1])))" "$OUT/bench/cudnn") variants generated"
t0=$(date +%s)
gpu "$BZ" run --system "$SLUG" --bench-dir "$OUT/bench" --backend cudnn --db "$DB" --repetitions 3 --jobs "$(nproc)"
CAMPAIGN_SECONDS=$(( $(date +%s) - t0 ))

# --- profiles and analysis ----------------------------------------------------------------------
nsys=(); command -v nsys >/dev/null 2>&1 && nsys=(--nsys)
analyses=()
for i in "${!MODELS[@]}"; do
  m=${MODELS[$i]}
  say "profile + analyze: $m"
  gpu "$BZ" profile "${paths[$i]}" --framework torch --device cuda --out "$OUT/profile-$m" "${nsys[@]}"
  if [ "$DRY" = 1 ]; then
    gpu "$BZ" analyze "${paths[$i]}" --system "$SLUG" --db "$DB" --profile "$OUT/profile-$m" --json
  else
    "$BZ" analyze "${paths[$i]}" --system "$SLUG" --db "$DB" --profile "$OUT/profile-$m" --json \
      --report "$OUT/$m.html" > "$OUT/analyze-$m.json"
  fi
  analyses+=("$OUT/analyze-$m.json")
done

# --- results ------------------------------------------------------------------------------------
notes=(--note "campaign: $(date -u +%Y-%m-%d) on $(nproc) CPU cores, L2 flushed before every timed call, 3 repetitions")
[ -n "$TRANSFORMER_NOTE" ] && notes+=(--note "$TRANSFORMER_NOTE")
gpu "$PY" scripts/gpu-results.py --db "$DB" --system "$SLUG" --out "$RESULTS" --campaign-seconds "$CAMPAIGN_SECONDS" \
  --smoke "$OUT/smoke.log" "${notes[@]}" "${analyses[@]}"
if [ "$DRY" = 1 ]; then
  say "dry run done: the steps above that need no GPU ran; the 'would run' lines need one"
else
  say "done: $DB, $RESULTS, HTML reports in $OUT"
fi
