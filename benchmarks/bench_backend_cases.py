"""How many of the ONNX package's own backend test models Benanza processes, and what the run for
shapes static inference cannot give costs.

Every node test case of the installed `onnx` (onnx.backend.test.case.node: the models and data of
its backend test suite) whose inputs and outputs are tensors is processed as `benanza generate`
would, fed its own test inputs (as `--input-data` does). Printed: cases processed and refused (by
reason), how many needed a run (shapes by execution, If branches taken, Loops and Scans unrolled),
the share of their running layers each backend covers, and the time and peak memory of the slowest
processing.

    python benchmarks/bench_backend_cases.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from benanza.errors import BenanzaError
from benanza.model_stats import total_stats
from benanza.processor import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="Write the numbers here too.")
    args = ap.parse_args()
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [c for c in collect_testcases(None)
                 if all(v.type.HasField("tensor_type") for v in list(c.model.graph.input) + list(c.model.graph.output))]
    import onnxruntime  # noqa: F401 - imported once here, so no case's time includes the imports
    import onnxruntime.tools.symbolic_shape_infer  # noqa: F401

    refused: Counter[str] = Counter()
    models, executed, branched, slowest = [], 0, 0, (0.0, "")
    unrolled: Counter[str] = Counter()  # cases with a Loop, with a Scan unrolled
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            path = Path(tmp) / f"{case.name}.onnx"
            onnx.save(case.model, str(path))
            inputs = case.data_sets[0][0]
            data = {i.name: numpy_helper.to_array(a) if isinstance(a, onnx.TensorProto) else np.asarray(a)
                    for i, a in zip(case.model.graph.input, inputs)}
            start = time.perf_counter()
            try:
                m = load_model(path, input_data=data)
            except BenanzaError as exc:
                refused[_reason(str(exc))] += 1
                continue
            took = time.perf_counter() - start
            slowest = max(slowest, (took, case.name))
            models.append(m)
            executed += bool(m.executed_shapes)
            branched += any(b in ("then", "else") for b in m.control_flow.values())
            unrolled.update({m.control_flow_ops[n] for n, b in m.control_flow.items() if b.endswith(" iterations")})
    total = total_stats(models)
    out = {
        "cases": len(cases), "processed": len(models), "refused": sum(refused.values()),
        "refused_by_reason": dict(refused.most_common()), "shapes_by_execution": executed,
        "if_branches_taken": branched, "loops_unrolled": unrolled["Loop"],
        "scans_unrolled": unrolled["Scan"], "uncosted_nodes": total.uncosted,
        "running_layers": total.running_layers,
        "covered_pct": {b.backend: round(b.covered_pct, 1) for b in total.backends},
        "slowest_s": round(slowest[0], 3), "slowest_case": slowest[1],
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


def _reason(message: str) -> str:
    """An error line without its file and values: what kind of refusal it is."""
    text = message.split(": ", 1)[-1]
    for marker in ("ONNX Runtime could not run it", "decides shapes or branches", "has no shape",
                   "is not a tensor", "shape inference failed", "cannot be processed"):
        if marker in text:
            return marker
    return text[:60]


if __name__ == "__main__":
    main()
