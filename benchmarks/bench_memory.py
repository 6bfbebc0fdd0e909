"""Wall time and peak resident memory of each command a user runs on one model, beside the
model's weight size (issue 31: a Llama-3.2-1B-shaped decode step, its weights in external data).

Each command runs as its own process, as a user types it: `benanza generate` (oneDNN, f32),
`benanza run` (its benchmarks at ``--threads``, a short fixed budget, no peaks), `benanza profile
--framework onnxruntime` (a few iterations), `benanza analyze` and `benanza check` (oneDNN).
Two peaks are recorded per command, because a command's memory lives in a tree of processes (the
benchmark binaries `run` and `check` start, the compiler and CMake under them, `profile`'s ONNX
Runtime children):

- largest process: ``ru_maxrss`` from ``os.wait4`` of the command's process. Linux gives a waited
  child's ru_maxrss as the larger of its own peak and the ru_maxrss of every descendant it (or
  they) waited for, so this is exact for the largest single process of the tree; this script is
  made the tree's child subreaper, so a descendant orphaned on the way is reparented here and
  its peak read when it is reaped, not lost to init.
- whole tree: the sum of VmRSS over this script's live descendants (the command and any orphan
  reparented here; from ``/proc/PID/task/*/children``), sampled every ``--sample-ms``: what the
  tree held at once (a parent holding the graph while its child runs), though a peak shorter
  than the period can be missed, and pages two processes share count twice.

A command's wall time ends when its process exits; its peaks include descendants that outlive it
(waited for up to ``ORPHAN_WAIT_S``).

Printed: JSON (one record per command) and a Markdown table.

    python benchmarks/bench_memory.py [--model FILE] [--work out/bench_memory] [--threads 2]

Without ``--model`` the model is bench_floors' ``llama1b-decode`` (made once under
``--work/models``: ~15 GB of memory and a few minutes to export).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import resource
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

BENANZA = str(Path(sys.executable).parent / "benanza")
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
ORPHAN_WAIT_S = 30.0


@dataclass(frozen=True)
class Measured:
    command: str
    exit_code: int
    wall_s: float
    largest_process_mb: float  # ru_maxrss: exact, one process
    tree_mb: float  # sampled sum over the live tree
    samples: int
    last_error: str  # the last stderr line of a failed command, else ""


def weights_mb(model: Path) -> float:
    """The bytes of the model's initializers (inline or external), from the graph alone."""
    import numpy as np
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    return sum(math.prod(t.dims) * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
               for t in graph.initializer) / 1e6


def _descendants(root: int) -> list[int]:
    """The live descendants of ``root``."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid != root:
            out.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:  # exited between the listing and the read
            continue
    return out


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0  # exited, or a zombie (no VmRSS line)


def _sample(period: float, stop: threading.Event, peak: list[int]) -> None:
    """The largest sum of this process's descendants' VmRSS in KB (``peak[0]``), and the number of
    samples taken (``peak[1]``)."""
    while not stop.is_set():
        peak[0] = max(peak[0], sum(_rss_kb(p) for p in _descendants(os.getpid())))
        peak[1] += 1
        stop.wait(period)


def _reap_orphans() -> int:
    """Waits for the descendants reparented to this process (it is their subreaper), up to
    ORPHAN_WAIT_S; their largest ru_maxrss in KB."""
    largest, deadline = 0, time.monotonic() + ORPHAN_WAIT_S
    while time.monotonic() < deadline:
        try:
            pid, _, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:  # none left
            return largest
        if pid == 0:
            time.sleep(0.1)
            continue
        largest = max(largest, usage.ru_maxrss)
    print(f"descendants still running after {ORPHAN_WAIT_S:g} s: {_descendants(os.getpid())}", file=sys.stderr)
    return largest


def measure(args: list[str], log: Path, period: float) -> Measured:
    """Runs ``benanza ARGS`` as a child, its stdout and stderr to ``log``.out/.err."""
    shown = "benanza " + " ".join(args)
    start = time.monotonic()
    with open(log.with_suffix(".out"), "w") as out, open(log.with_suffix(".err"), "w") as err:
        proc = subprocess.Popen([BENANZA, *args], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env=dict(os.environ, COLUMNS="200"))
    stop, peak = threading.Event(), [0, 0]
    sampler = threading.Thread(target=_sample, args=(period, stop, peak))
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    largest = max(usage.ru_maxrss, _reap_orphans())
    stop.set()
    sampler.join()
    lines = log.with_suffix(".err").read_text(errors="replace").strip().splitlines()
    failed = proc.returncode not in (0, 3)  # 3: analyze's "finished with warnings"
    return Measured(shown, proc.returncode, wall, largest * 1024 / 1e6, peak[0] * 1024 / 1e6, peak[1],
                    lines[-1] if failed and lines else "")


def commands(model: Path, work: Path, threads: int) -> list[tuple[str, list[str]]]:
    bench, db, prof = str(work / "bench"), str(work / "perf.db"), str(work / "prof")
    return [
        ("generate", ["generate", str(model), "--out", bench, "--backend", "onednn", "--dtype", "f32"]),
        ("run", ["run", "--bench-dir", bench, "--system", "bench-memory", "--db", db, "--backend", "onednn",
                 "--threads", str(threads), "--min-time", "0.01", "--repetitions", "1", "--no-peaks",
                 "--max-contention", "1", "--force"]),
        ("profile", ["profile", str(model), "--framework", "onnxruntime", "--out", prof, "--threads", str(threads),
                     "--warmup", "1", "--iterations", "3", "--trace-iterations", "1"]),
        ("analyze", ["analyze", str(model), "--system", "bench-memory", "--db", db, "--profile", prof,
                     "--allow-contended"]),
        ("check", ["check", str(model), "--bench-dir", bench, "--threads", str(threads)]),
    ]


def _made_apart(name: str, out: Path) -> Path:
    """bench_floors' model NAME, exported in a process of its own. Made here it would leave this
    script's peak RSS at ~10 GB, and Linux hands a process's peak on to the children it starts (a
    forked child begins with it and exec keeps the larger of it and the new image's): every
    command would then read ~10 GB as its largest process, whatever it used."""
    code = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
            "from bench_floors import make_llama; print(make_llama(sys.argv[2], Path(sys.argv[3])))")
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), name, str(out)],
                          stdout=subprocess.PIPE, text=True, check=True)
    return Path(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="ONNX file (default: bench_floors' llama1b-decode, made once)")
    ap.add_argument("--work", type=Path, default=Path("out/bench_memory"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sample-ms", type=float, default=20.0)
    args = ap.parse_args()
    work = args.work.resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    model = args.model
    if model is None:
        (work / "models").mkdir(exist_ok=True)
        start = time.monotonic()
        model = _made_apart("llama1b-decode", work / "models")
        print(f"model made in {time.monotonic() - start:.0f} s: {model}", file=sys.stderr)
    model = model.resolve()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit(f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}")
    weights = weights_mb(model)
    # a floor under every command's "largest process" (inherited at its start, as above): a
    # figure at or below it says nothing about the command
    own_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6
    load = [os.getloadavg()[0]]
    results = []
    for name, argv in commands(model, work, args.threads):
        results.append(measure(argv, work / "logs" / name, args.sample_ms / 1000))
        load.append(os.getloadavg()[0])
        print(f"{name}: {results[-1].wall_s:.1f} s, {results[-1].largest_process_mb:.0f} MB", file=sys.stderr)
    print(json.dumps({"model": str(model), "weights_mb": weights, "threads": args.threads,
                      "load_average_1min": [min(load), max(load)], "cpus": os.cpu_count(),
                      "script_peak_mb": own_mb, "commands": [asdict(r) for r in results]}, indent=1))
    print(f"\nmodel {model.name}: {weights:.0f} MB of weights; load average (1 min) {min(load):.2f}–{max(load):.2f} "
          f"on {os.cpu_count()} CPUs; this script's own peak {own_mb:.0f} MB (a largest-process figure at or "
          f"below it is inherited, not the command's)\n")
    print("| command | exit | wall s | peak RSS, largest process MB | peak RSS, whole tree MB (sampled) | "
          "× weights |\n| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        peak = max(r.largest_process_mb, r.tree_mb)
        print(f"| `{r.command.split()[1]}` | {r.exit_code} | {r.wall_s:.1f} | {r.largest_process_mb:.0f} | "
              f"{r.tree_mb:.0f} | {peak / weights:.2f} |")
    for r in results:
        if r.last_error:
            print(f"\n{r.command.split()[1]} failed: {r.last_error}")


if __name__ == "__main__":
    main()
