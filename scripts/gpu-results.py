#!/usr/bin/env python3
"""Renders docs/results-<gpu>.md from what the GPU kit (scripts/gpukit.py) measured.

Inputs are only files the pipeline wrote: the performance database, `benanza analyze --json`
documents, the campaign's timing, and the smoke run's BENANZA_RESULT lines. Nothing here
invents a number: a missing input becomes a line saying it is missing.

usage: gpu-results.py --db DB --system NAME --out FILE.md --campaign-seconds S
                      [--smoke smoke.log] [--note TEXT ...] ANALYSIS.json ...
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

from benanza.backends.cudnn import CONV_ALGOS, CUDNN_MATH_TYPES, PLAN_ALGOS
from benanza.peaks import Peaks, datasheet_for
from benanza.perfdb import PerfDB
from benanza.records import Result, Status, Variant


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out + [""]


def campaign(results: list[Result], seconds: float) -> list[str]:
    by_api: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        by_api[r.variant.api][r.status.value] += 1
    rows = [[api, str(sum(c.values())), str(c["ok"]), str(c["unsupported"]), str(c["failed"])]
            for api, c in sorted(by_api.items())]
    total = Counter(r.status.value for r in results)
    rows.append(["**all**", str(len(results)), str(total["ok"]), str(total["unsupported"]), str(total["failed"])])
    flushed = Counter(int(r.metrics.get("l2_flushed", -1)) for r in results if r.ok)
    host_bound = sum(1 for r in results if r.ok and r.metrics.get("host_bound_reps", 0) > 0)
    lines = ["## Campaign", "",
             f"`benanza run` wall time (build included): **{seconds:.0f} s** for {len(results)} variants.", ""]
    lines += _table(["api", "variants", "ok", "unsupported", "failed"], rows)
    lines += [(f"L2 cache flushed before every timed call in {flushed[1]} ok results, hot in {flushed[0]}; "
               f"{host_bound} ok results had a repetition where the host fell behind the GPU "
               f"(`host_bound_reps` > 0)."), ""]
    failures = Counter(r.message.split(" (")[0][:120] for r in results if r.status is Status.FAILED)
    if failures:
        lines += ["Most frequent failure messages:", ""]
        lines += _table(["count", "message"], [[str(n), m.replace("|", "\\|")] for m, n in failures.most_common(10)])
    return lines


# The GPU paths the cuDNN/cuBLAS backends gained after the kit's first models (the zoo's CNNs and
# the transformer encoder), which the kit's int8 encoder and masked decoder reach: whether the
# GPU ran them is what the campaign first tells of them.
PATHS: tuple[tuple[str, Callable[[Variant], bool]], ...] = (
    ("int8 GEMM (MatMulInteger: cublasLtMatmul, s8, CUBLAS_COMPUTE_32I)",
     lambda v: v.api == "cublasLtMatmul" and v.dtype in ("u8", "i8")),
    ("quant graph nodes (Cast, DequantizeLinear, DynamicQuantizeLinear)", lambda v: v.api == "cudnn_frontend.quant"),
    ("boolean mask ops (And, Or, Equal: BYTE_BOOLEAN pointwise)", lambda v: v.dtype == "b"),
    ("tanh-GELU (GELU_APPROX_TANH_FWD pointwise)",
     lambda v: v.fusion == "gelu_tanh" or v.layer_key.startswith("eltwise:gelutanh_")),
)


def paths(results: list[Result]) -> list[str]:
    """Per path: its stored results by status, and the first failure's message (a cuDNN older
    than 9.25 fails every boolean graph, for one)."""
    rows = []
    for label, on_path in PATHS:
        mine = [r for r in results if on_path(r.variant)]
        count = Counter(r.status.value for r in mine)
        failure = next((r.message for r in mine if r.status is Status.FAILED), "")
        rows.append([label, str(len(mine)), str(count["ok"]), str(count["unsupported"]), str(count["failed"]),
                     failure[:120].replace("|", "\\|") or "—"])
    return ["## int8, quantization, boolean and tanh-GELU paths", "",
            ("Results stored for the variants of each path (0: the campaign did not reach them, or no model "
             "of it has one). `benanza check` compares oneDNN benchmarks with ONNX Runtime, not these: "
             "on the GPU they are timed, their values unchecked (docs/gpu.md)."), ""] + _table(
        ["path", "results", "ok", "unsupported", "failed", "first failure"], rows)


def _by_problem(results: list[Result], keep: Callable[[Result], bool]) -> dict[tuple, list[Result]]:
    """The kept results per convolution problem: layer, dtype, layout and math."""
    groups: dict[tuple, list[Result]] = defaultdict(list)
    for r in results:
        if keep(r):
            groups[(r.variant.layer_key, r.variant.dtype, r.variant.layout, r.variant.math)].append(r)
    return groups


def algorithms(results: list[Result]) -> list[str]:
    """Per convolution problem: the heuristic's and Find's algorithm against the fastest timed."""
    groups = _by_problem(results, lambda r: r.variant.api == "cudnnConvolutionForward" and r.ok)
    rows, same_h, same_f, loss_h = [], 0, 0, []
    for (key, dtype, layout, math), rs in sorted(groups.items()):
        best = min(rs, key=lambda r: r.median_ms or 0.0)
        m = best.metrics
        h, f = int(m.get("heuristic_algo", -1)), int(m.get("find_algo", -1))
        by_algo = {r.variant.algo: r.median_ms for r in rs}
        h_name = CONV_ALGOS[h] if 0 <= h < len(CONV_ALGOS) else "none"
        f_name = CONV_ALGOS[f] if 0 <= f < len(CONV_ALGOS) else "none"
        same_h += h_name == best.variant.algo
        same_f += f_name == best.variant.algo
        if h_name in by_algo and best.median_ms:
            loss_h.append(by_algo[h_name] / best.median_ms)
        hm = int(m.get("heuristic_math", -1))
        rows.append([key[:60], dtype, layout, math, best.variant.algo, _ms(best.median_ms), h_name,
                     _ms(by_algo.get(h_name)), CUDNN_MATH_TYPES[hm] if 0 <= hm < 4 else "—", f_name])
    lines = ["## Heuristic vs best algorithm", ""]
    if not groups:
        return lines + ["No convolution results.", ""]
    lines += [f"{len(groups)} convolution problems: the heuristic's first choice was the fastest timed "
              f"algorithm in {same_h}, cudnnFind's in {same_f}. "
              + (f"Heuristic choice ÷ best: median {statistics.median(loss_h):.2f}, max {max(loss_h):.2f}."
                 if loss_h else ""), ""]
    return lines + _table(["layer", "dtype", "layout", "math", "best", "best ms", "heuristic", "heuristic ms",
                           "heuristic math", "Find"], rows[:60])


def _impossible(a: dict) -> str:
    sol = a.get("speed_of_light")
    return str(len(sol["impossible"])) if sol else "—"


def _whatif(bound: dict | None) -> str:
    """A what-if's sequential bound, marked where layers of it had no result in that dtype or layout
    (the analyzer's `partial`: a figure the campaign has not finished, not yet a bound)."""
    if not bound:
        return "—"
    return _ms(bound.get("sequential_ms")) + (" (partial)" if bound.get("partial") else "")


def models(analyses: list[dict]) -> list[str]:
    """A row per analysis (a model at a batch size in one math mode, as the kit ran them); the
    what-ifs of the exact ones (their f32 column is the exact bound)."""
    rows, whatif = [], []
    for a in analyses:
        b = a["bounds"]
        # an exact-f32 bound against a run whose library calls allowed TF32 bounds another run: no ratio
        tf32_run = a["math"] == "exact" and a["dtype"] == "f32" and (a.get("framework_tf32") or {}).get("calls")
        br = ["— (TF32 run)"] * 2 if tf32_run else [_ratio(b.get("br_sequential")), _ratio(b.get("br_parallel"))]
        rows.append([a["model"], str(a["batch_size"]), a["math"], a["dtype"], _ms(a.get("measured_ms")),
                     _ms(b["sequential_ms"]), _ms(b["parallel_ms"]), *br, "yes" if b["partial"] else "no",
                     str(len(a["coverage"].get("missing", []))), str(len(a["coverage"].get("not_covered", []))),
                     _impossible(a)])
        if a["math"] != "exact":
            continue
        tc = a.get("tensor_cores", {}).get("bounds", {})
        fused = a.get("fusion", {}).get("bounds")
        joint = a.get("joint")
        whatif.append([a["model"], str(a["batch_size"]), _whatif(tc.get("f32")), _whatif(tc.get("f16")),
                       _whatif(tc.get("f16/nhwc")), _whatif(fused), _whatif(joint),
                       str(a.get("tensor_cores", {}).get("tc_kernels", "—")) + "/" +
                       str(a.get("tensor_cores", {}).get("kernels", "—"))])
    lines = ["## Bounds vs PyTorch (CUDA)", "",
             ("Measured: `benanza profile --framework torch --device cuda` (Benanza's eager executor of the "
              "ONNX graph) at the row's batch size, trimmed mean. BR = bound ÷ measured. Math `exact`: f32 "
              "layers bounded by f32 FMA variants only (`analyze --math exact`); `tf32`: TF32 Tensor Core "
              "variants admitted (`--math tf32`). PyTorch's defaults (TF32 in its convolutions, the cuDNN ones "
              "and the 1x1 ones it runs as `COMPUTE_32F_FAST_TF32` cuBLASLt GEMMs; exact f32 in its other "
              "matmuls) are what the `tf32` rows bound; the `exact` rows bound PyTorch with TF32 turned off, so "
              "their BR is left out (— (TF32 run)) where the profiled run's library calls allowed TF32. "
              "Faster than roofline: the layers' results more than 10% faster than their roofline time "
              "(`speed_of_light.impossible`: a measurement defect, kept out of the bound)."), ""]
    lines += _table(["model", "batch", "math", "dtype", "measured ms", "sequential bound", "parallel bound",
                     "BR seq", "BR par", "partial", "missing layers", "not covered", "faster than roofline"], rows)
    lines += ["## What-ifs: fp16 / Tensor Cores, fusion, all together", "",
              ("Sequential bounds in ms of the exact analyses; (partial): some layers had no result in that "
               "dtype or layout yet; TC kernels = Tensor Core kernels / kernels seen in the profile."), ""]
    lines += _table(["model", "batch", "f32", "f16", "f16 nhwc", "fused (f32)", "joint", "TC kernels"], whatif)
    return lines


SKIPPED = "gpukit: smoke skipped: "


def peaks(measured: Peaks | None, device: str) -> list[str]:
    """What cuBLAS and device copies attained (`benanza run` measures them once per stack), beside
    the GPU's datasheet: the share of its published peak this board and stack reach."""
    lines = ["## Peaks (speed of light)", ""]
    if measured is None:
        return lines + ["No peaks stored for this stack (`benanza peaks --backend cudnn` measures them).", ""]
    sheet = datasheet_for(device)
    rows = []
    for p in measured.peaks:
        if p.kind == "gemm":
            ref = sheet.gemm(p.dtype) if sheet else None
            rows.append([f"GEMM {p.dtype}", f"{p.value / 1e12:.1f} TFLOP/s", f"{p.size}³",
                         f"{ref:g} TFLOP/s" if ref else "—", _ratio(p.value / 1e12 / ref) if ref else "—"])
    for dtype, message in measured.unsupported:
        rows.append([f"GEMM {dtype}", "not run: " + message.replace("|", "\\|")[:100], "", "", ""])
    for p in measured.ladder:
        ref = sheet.memory_gb_s if sheet and p.level == "DRAM" else None
        rows.append([f"bandwidth {p.level}", f"{p.value / 1e9:.0f} GB/s", f"{p.size / 2**20:.3g} MiB",
                     f"{ref:g} GB/s" if ref else "—", _ratio(p.value / 1e9 / ref) if ref else "—"])
    lines += _table(["peak", "measured", "size", f"datasheet ({sheet.name})" if sheet else "datasheet",
                     "measured / datasheet"], rows)
    if sheet:
        lines += [f"Datasheet: {sheet.source} (dense, boost clock), a reference only; the roofs are the measured "
                  f"peaks.", ""]
    return lines


def smoke(path: Path | None) -> list[str]:
    lines = ["## Smoke run under compute-sanitizer (every family)", ""]
    if path is None or not path.is_file():
        return lines + ["Not run.", ""]
    skipped = [line for line in path.read_text(errors="replace").splitlines() if line.startswith(SKIPPED)]
    if skipped:  # scripts/gpukit.py writes this line where the sanitizer refuses the device
        return lines + [f"Skipped: {skipped[0][len(SKIPPED):]}.", ""]
    results = [json.loads(line.split(" ", 1)[1]) for line in path.read_text(errors="replace").splitlines()
               if line.startswith("BENANZA_RESULT ")]
    errors = [line for line in path.read_text(errors="replace").splitlines() if line.startswith("========= ")]
    by_family: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        api = r["name"].split("/api=", 1)[1].split("/", 1)[0] if "/api=" in r["name"] else "?"
        by_family[api][r["status"]] += 1
    lines += _table(["api", "ok", "unsupported", "failed"],
                    [[a, str(c["ok"]), str(c["unsupported"]), str(c["failed"])] for a, c in sorted(by_family.items())])
    summary = [e for e in errors if "ERROR SUMMARY" in e]
    lines += [f"compute-sanitizer: {summary[-1][10:] if summary else 'no summary line (see the log)'}", ""]
    return lines


def _comparison(path: Path | None, title: str, script: str, ratio: str, empty: str) -> tuple[list[str], dict | None]:
    """A comparison section's heading, and the script's JSON where it ran and some row has a
    ``ratio`` (None: the lines already say why not)."""
    lines = [f"## {title}", ""]
    if path is None or not path.is_file():
        return lines + [f"Not run in this call (benchmarks/{script}).", ""], None
    data = json.loads(path.read_text())
    if not any(r[ratio] is not None for r in data["rows"]):
        return lines + [empty, ""], None
    return lines, data


def fidelity(path: Path | None) -> list[str]:
    """benchmarks/fidelity_cuda.py's comparison: each convolution's fastest stored time against
    PyTorch's own search of the same library on the same GPU."""
    lines, data = _comparison(path, "Timing fidelity: our convolutions vs PyTorch's", "fidelity_cuda.py", "ratio_exact",
                              "No convolution has an ok f32 NCHW FMA result to compare.")
    if data is None:
        return lines
    s, rows = data["summary"], data["rows"]
    lines += [(f"{s['convolutions']} unique convolutions: the fastest f32 NCHW FMA algorithm Benanza timed "
               f"(L2 flushed) ÷ the same convolution through PyTorch {s['torch']} (cuDNN {s['torch_cudnn']}, "
               f"`cudnn.benchmark`, L2 flushed, TF32 off: exact f32 on both sides). Target ≤ 1.0: median "
               f"**{s['median_ratio_exact']:.2f}**, {s['over_1']} over 1.0, {s['over_1_05']} over 1.05, max "
               f"{s['max_ratio_exact']:.2f}. Against PyTorch's defaults (TF32 allowed in cuDNN convolutions), "
               f"median {s['median_ratio_default']:.2f}: what an f32 bound without TF32 variants misses."), ""]
    worst = sorted(rows, key=lambda r: -r["ratio_exact"])[:10]
    lines += _table(["layer", "ours ms", "algorithm", "PyTorch exact ms", "ratio", "PyTorch TF32 ms"],
                    [[r["layer"][:60], _ms(r["ours_ms"]), r["variant"].split("/algo=", 1)[1].split("/", 1)[0],
                      _ms(r["torch_exact_ms"]), _ratio(r["ratio_exact"]), _ms(r["torch_default_ms"])]
                     for r in worst])
    return lines + [""]


def kernels(path: Path | None) -> list[str]:
    """benchmarks/kernel_durations.py's comparison: the event time stored for one call of each
    variant a CNN's exact bound takes ÷ the summed CUPTI durations of the kernels that call ran."""
    lines, data = _comparison(path, "Our times vs the kernels' own durations", "kernel_durations.py", "ratio",
                              "No result of the CUPTI-mode run carried a kernel time to compare.")
    if data is None:
        return lines
    s, rows = data["summary"], [r for r in data["rows"] if r["ratio"] is not None]
    lines += [(f"{s['compared']} variants, those the exact bounds of the three CNNs take at batch 1, rebuilt in "
               f"CUPTI mode and run with the L2 hot: the time Benanza stores for one call (CUDA events around "
               f"it) ÷ the summed durations of the kernels the call launched (CUPTI's activity records). Target "
               f"≤ {s['target']:g}: median **{s['median_ratio']:.2f}**, {s['over_target']} over {s['target']:g}, "
               f"max {s['max_ratio']:.2f}, min {s['min_ratio']:.2f}"
               + (f" ({s['below_1']} below 1: the recorded calls' kernels ran longer than the timed calls)"
                  if s["below_1"] else "")
               + (f"; {s['incomplete']} with kernel records CUPTI had not completed (their kernel time "
                  f"is short)" if s["incomplete"] else "") + "."), ""]
    worst = sorted(rows, key=lambda r: -r["ratio"])[:10]
    lines += _table(["variant", "ours ms", "kernels ms", "kernels per call", "ratio"],
                    [[f"{r['layer'][:50]} {Variant.from_name(r['variant']).api}", _ms(r["event_ms"]),
                      _ms(r["kernel_ms"]), f"{r['kernels_per_call']:g}", _ratio(r["ratio"])]
                     for r in worst])
    return lines + [""]


def graph_plans(results: list[Result]) -> list[str]:
    """Per convolution problem through the graph API whose every plan slot has a result: the
    frontend heuristic's first plan (``plan0``, what a framework that takes the heuristic runs)
    against the fastest plan timed."""
    ratios, first_best = [], 0
    for rs in _by_problem(results, lambda r: r.variant.api == "cudnn_frontend.conv").values():
        timed = {r.variant.algo: r.median_ms for r in rs if r.ok and r.median_ms}
        if {r.variant.algo for r in rs} != set(PLAN_ALGOS) or "plan0" not in timed:
            continue  # slots still to run, or the heuristic's first plan refused
        fastest = min(timed.values())
        ratios.append(timed["plan0"] / fastest)
        first_best += timed["plan0"] == fastest
    if not ratios:
        return ["No graph-API convolution has a result in every plan slot yet.", ""]
    return [f"Through the graph API (`cudnn_frontend.conv`), {len(ratios)} convolution problems have a result in "
            f"all {len(PLAN_ALGOS)} plan slots: the heuristic's first plan (`plan0`) was the fastest in "
            f"{first_best}; `plan0` ÷ fastest plan: median {statistics.median(ratios):.2f}, max {max(ratios):.2f}.",
            ""]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", required=True, type=Path)
    p.add_argument("--system", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--campaign-seconds", type=float, required=True)
    p.add_argument("--smoke", type=Path)
    p.add_argument("--note", action="append", default=[])
    p.add_argument("--fidelity", type=Path, help="benchmarks/fidelity_cuda.py's JSON")
    p.add_argument("--kernels", type=Path, help="benchmarks/kernel_durations.py's JSON")
    p.add_argument("analyses", nargs="*", type=Path)
    args = p.parse_args()
    with PerfDB(args.db) as db:
        system = db.system(args.system)
        if system is None:
            print(f"gpu-results: {args.db}: no system {args.system!r}", file=sys.stderr)
            return 1
        results = db.results(args.system)
        measured = db.peaks(system)
    analyses = [a for path in args.analyses for a in json.loads(path.read_text())["analyses"]]
    lines = [f"# Benanza on {system.device}", "",
             ("Written by `scripts/gpukit.py device all` (or `device report`; docs/gpu.md) from the measurements "
              "of that campaign."),
             ""]
    lines += _table(["component", "version"], [[k, v] for k, v in system.stack])
    lines += [f"- {n}" for n in args.note] + ([""] if args.note else [])
    lines += campaign(results, args.campaign_seconds) + peaks(measured, system.device) + models(analyses)
    lines += fidelity(args.fidelity) + kernels(args.kernels) + paths(results) + algorithms(results)
    lines += graph_plans(results)
    lines += smoke(args.smoke)
    args.out.write_text("\n".join(lines))
    print(f"gpu-results: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
