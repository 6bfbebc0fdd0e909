#!/usr/bin/env bash
# The main job end to end on the embedded default, no GPU needed:
#   reference models → unique layers → oneDNN (and cuDNN) benchmarks → performance DB
#   → ONNX Runtime profile → lower bounds, Benanza ratio, advice, HTML report.
# Everything lands in out/demo (override with BENANZA_DEMO_OUT); re-running is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate

OUT=${BENANZA_DEMO_OUT:-out/demo}
DB="$OUT/benanza.db"
SYSTEM=${BENANZA_DEMO_SYSTEM:-local-cpu}
MODELS=(lenet inception-v1 resnet50-v1)
mkdir -p "$OUT"

only=(); paths=()
for m in "${MODELS[@]}"; do only+=(--only "$m"); paths+=("models/$m.onnx"); done
benanza zoo --out models "${only[@]}"

# every backend's sources; only oneDNN's are built and run on a machine without a GPU
benanza generate "${paths[@]}" --out "$OUT/bench"
benanza run --bench-dir "$OUT/bench" --system "$SYSTEM" --db "$DB" --backend onednn \
  --min-time 0.05 --repetitions 3

# `analyze` refuses (exit status 3, one line naming the layers and the command that re-measures
# them) when a bound would rest on results measured while other processes took the CPU: on a busy
# machine the demo says so and goes on, as a wrong number is worse than none.
refused=()
analyze() {
  local rc=0
  benanza analyze "$@" || rc=$?
  if [ "$rc" -eq 3 ]; then [[ " ${refused[*]} " == *" $1 "* ]] || refused+=("$1"); elif [ "$rc" -ne 0 ]; then exit "$rc"; fi
}

for m in inception-v1 resnet50-v1; do
  benanza profile "models/$m.onnx" --framework onnxruntime --out "$OUT/profile-$m"
  analyze "models/$m.onnx" --system "$SYSTEM" --db "$DB" --profile "$OUT/profile-$m" --report "$OUT/$m.html"
done
# PyTorch on CPU sends its convolutions to oneDNN: its log answers Q3/Q4 against the database
if python -c "import torch" 2>/dev/null; then
  benanza profile models/inception-v1.onnx --framework torch --out "$OUT/profile-inception-v1-torch"
  analyze models/inception-v1.onnx --system "$SYSTEM" --db "$DB" \
    --profile "$OUT/profile-inception-v1-torch" --report "$OUT/inception-v1-torch.html"
fi
if [ ${#refused[@]} -gt 0 ]; then
  echo "not measured: this machine was busy while the benchmarks of ${refused[*]} ran, so no bound is" \
       "printed for them; run the re-measure command above when it is idle"
fi
shopt -s nullglob
reports=("$OUT"/*.html)
echo "reports: ${reports[*]:-none}"
