"""Real third-party models (scripts/real_models.py: ONNX files inside pinned public wheels), each
processed in a child process of its own as `benanza generate` processes it, with the inputs its
package feeds it. Prints one row per model: package, kind, nodes (subgraphs included), processed
or the refusal's line, whether ONNX Runtime had to run it (shapes static inference leaves unknown,
If/Loop/Scan decided), running layers, the share of them each backend's benchmarks cost,
uncosted nodes, processing seconds; then, on the largest model that needed the run, the time spent
in those runs and the child's peak resident memory against its resident memory before processing.

    python benchmarks/real_models.py [--json FILE]

Times include the child's processing only (imports excluded); under a loaded machine they are
upper figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _real_models():
    spec = importlib.util.spec_from_file_location("real_models", REPO / "scripts" / "real_models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["real_models"] = module
    spec.loader.exec_module(module)
    return module


def _nodes(graph) -> int:
    return sum(1 + sum(_nodes(a.g) for a in n.attribute if a.type == a.GRAPH) for n in graph.node)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def _process(path: str, shapes: dict, values: dict, out: mp.Queue) -> None:
    import onnx

    from benanza import control_flow, shapes_by_execution
    from benanza.errors import BenanzaError
    from benanza.model_stats import model_stats
    from benanza.processor import load_model

    spent = [0.0, 0]  # seconds inside ONNX Runtime runs for shapes or branches, and their count
    real_run = shapes_by_execution.run_once

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return real_run(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t
            spent[1] += 1

    # both stages call it (control_flow imported it by name): time each call where it is made
    shapes_by_execution.run_once = timed
    control_flow.run_once = timed
    row: dict = {"nodes": _nodes(onnx.load(path, load_external_data=False).graph), "rss_before_mb": _rss_mb()}
    t = time.perf_counter()
    try:
        m = load_model(path, input_shapes=shapes, input_values=values)
    except BenanzaError as e:
        row.update(processed=False, reason=str(e).splitlines()[0])
    else:
        s = model_stats(m)
        row.update(processed=True, reason="", running=s.running_layers, uncosted=len(m.uncosted),
                   covered={b: s.backend(b).covered_pct for b in ("onednn", "cudnn")},
                   executed_shapes=m.executed_shapes, control_flow=len(m.control_flow))
    row.update(process_s=time.perf_counter() - t, execution_s=spent[0], executions=spent[1],
               peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    out.put(row)


def measure(rm) -> dict:
    q: mp.Queue = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=_process, args=(str(rm.path()), rm.input_shapes(), rm.input_values(), q))
    p.start()
    row = q.get()
    p.join()
    return {"model": rm.name, "package": f"{rm.package.name} {rm.package.version}", "kind": rm.kind, **row}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    real = _real_models()
    real.fetch()
    rows = [measure(rm) for rm in real.MODELS]
    print("| model | package | kind | nodes | processed | needed the run | running layers | covered oneDNN | "
          "covered cuDNN | uncosted | process s |")
    print("|---|---|---|---:|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if not r["processed"]:
            print(f"| {r['model']} | {r['package']} | {r['kind']} | {r['nodes']} | no: {r['reason']} | | | | | | "
                  f"{r['process_s']:.2f} |")
            continue
        needed = [f"{r['executed_shapes']} shapes"] * bool(r["executed_shapes"]) + \
                 [f"{r['control_flow']} If/Loop/Scan"] * bool(r["control_flow"])
        cov = r["covered"]
        print(f"| {r['model']} | {r['package']} | {r['kind']} | {r['nodes']} | yes | {', '.join(needed) or 'no'} | "
              f"{r['running']} | {cov['onednn']:.1f} % | {cov['cudnn']:.1f} % | {r['uncosted']} | "
              f"{r['process_s']:.2f} |")
    ran = [(real.MODELS[i].path().stat().st_size, r) for i, r in enumerate(rows) if r["executions"]]
    if ran:
        size, r = max(ran, key=lambda e: e[0])
        print(f"\nlargest model that needed the run: {r['model']} ({size / 1e6:.1f} MB): "
              f"{r['executions']} ONNX Runtime runs, {r['execution_s']:.2f} s of its {r['process_s']:.2f} s "
              f"processing; peak RSS {r['peak_rss_mb']:.0f} MB ({r['rss_before_mb']:.0f} MB before processing)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
