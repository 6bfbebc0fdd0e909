"""The ``benanza`` command: thin click subcommands over the library stages."""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import sqlite3
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, cast

import click

from .errors import BenanzaError, FileProblem
from .escape import printable
from .limits import MAX_DIM
from .measurement import DEFAULT_PRECISION, MAX_CONTENTION, MAX_SAMPLING_SECONDS, UNSTABLE_RSD

if TYPE_CHECKING:
    from rich.console import Console

    from .generator import GenOptions

# Piped or logged output has no terminal width; Rich would fall back to 80 columns and cut
# model names and keys. COLUMNS still wins when set.
_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160


def _terminal(stderr: bool) -> Console:
    """Every string printed, names from models, logs and databases included, shows its
    control characters escaped: a node name must not drive the user's terminal."""
    from rich.console import Console
    from rich.text import Text

    class _Terminal(Console):
        def render_str(self, text: str, **kwargs) -> Text:  # type: ignore[override]
            return super().render_str(printable(text), **kwargs)

    # markup=False: names and paths come from files and users; `[/]` or `[link=...]` in a node
    # name must print as itself. What is styled on purpose is built as Text.
    return _Terminal(stderr=stderr, width=_WIDTH, markup=False)


class _OnFirstUse:
    """A terminal made when first printed to: loading Rich is a tenth of a command's start-up,
    and `analyze --json` or `db` queries print no table."""

    def __init__(self, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def _made(self) -> Console:
        if self._console is None:
            self._console = _terminal(self._stderr)
        return self._console

    def __getattr__(self, name: str) -> object:
        return getattr(self._made(), name)

    # Rich's live displays (progress bars) hold the console as a context while they redraw
    def __enter__(self) -> Console:
        return self._made().__enter__()

    def __exit__(self, *exc_info: object) -> None:
        self._made().__exit__(*exc_info)  # type: ignore[arg-type]


console = cast("Console", _OnFirstUse(stderr=False))
err_console = cast("Console", _OnFirstUse(stderr=True))


def print_error(message: object) -> None:
    from rich.text import Text

    err_console.print(Text.assemble(("error:", "bold red"), f" {printable(str(message))}"), highlight=False,
                      soft_wrap=True)


def print_warning(message: object) -> None:
    from rich.text import Text

    err_console.print(Text.assemble(("warning:", "yellow"), f" {printable(str(message))}"), highlight=False,
                      soft_wrap=True)


class FiniteRange(click.FloatRange):
    """A float range that also refuses nan and inf (which pass every comparison a range makes,
    or are no number to time, store or print as JSON)."""

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


def echo_json(doc: object) -> None:
    """``doc`` as JSON on stdout; a stdout that cannot take it (a full disk, a closed pipe)
    is one error line."""
    try:
        click.echo(json.dumps(doc, indent=1))
        sys.stdout.flush()
    except OSError as exc:
        # what stays buffered would fail again at exit, after the error line
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise BenanzaError(f"cannot write to standard output ({exc.strerror or exc})") from None


# Exit status of a bug in Benanza (sysexits' EX_SOFTWARE), apart from 1 for bad input.
INTERNAL_ERROR_STATUS = 70


class _Group(click.Group):
    """The one error boundary: bad input (a BenanzaError) and the environment (a database the
    library did not expect, a file system that refuses) become one clean line; anything else is
    a bug in Benanza, said so in one line, with the traceback at -vv."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BenanzaError as exc:
            print_error(exc)
            sys.exit(1)
        except sqlite3.Error as exc:
            print_error(f"performance database: {exc}")
            sys.exit(1)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise  # usage errors and exits: click prints and exits itself
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise  # click closes a broken pipe quietly
            print_error(exc)  # names the file: "[Errno 13] Permission denied: 'out/layers.json'"
            sys.exit(1)
        except Exception as exc:  # noqa: BLE001 - the boundary: a bug, never a raw traceback
            from rich.text import Text

            shown = ctx.params.get("verbose", 0) >= 2
            if shown:
                err_console.print(traceback.format_exc(), highlight=False, soft_wrap=True, end="")
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "(no message)"
            err_console.print(Text.assemble(("internal error:", "bold red"), f" {type(exc).__name__}: {first} "
                                            + ("(a bug in Benanza: traceback above)" if shown
                                               else "(rerun with -vv for the traceback)")),
                              highlight=False, soft_wrap=True)
            sys.exit(INTERNAL_ERROR_STATUS)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.version_option(package_name="benanza")
def main(verbose: int) -> None:
    """Benanza: how fast could your deep-learning model run, and why doesn't it?

    \b
    Pipeline:
      benanza zoo                      build the paper's 30 reference models into models/
      benanza generate models/*.onnx   unique layers → benchmark manifest (and C++ benchmarks)
      benanza run --system NAME        build and run the benchmarks into the performance DB
      benanza peaks --system NAME      measure the stack's GEMM and bandwidth peaks (the roofline)
      benanza check MODELS             check what the oneDNN benchmarks compute against ONNX Runtime
      benanza profile MODEL            run a framework on the model and record what it did
      benanza analyze MODEL            lower bounds, Benanza ratio and optimization advice
      benanza db ...                   inspect, export and merge performance databases
      benanza campaign ...             the same on many Slurm systems, into one database
    """
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


# --- shared options ----------------------------------------------------------------------

def batch_options(f):
    f = click.option("--input-shape", "input_shape", multiple=True, metavar="[MODEL:]NAME=D1xD2x..",
                     help="Concrete shape of an input whose non-batch dims are symbolic (repeatable). It "
                          "applies to each model that has input NAME; MODEL: (path, file name or stem) "
                          "limits it to one model.")(f)
    f = click.option("--batch-size", "-b", type=click.IntRange(min=1, max=MAX_DIM), default=1, show_default=True,
                     help="Batch size: sets each graph input's batch axis (dim 0 of an image, dim 1 of a "
                          "sequence-first RNN input; a symbolic dim 0 otherwise).")(f)
    return f


def value_options(f):
    """What the run for shapes static inference cannot resolve feeds (docs/generate.md)."""
    f = click.option("--input-data", "input_data", type=click.Path(dir_okay=False), default=None,
                     metavar="FILE.npz", help="Real inputs (one array per input name) for the run that finds "
                                              "shapes static inference leaves unknown; the arrays give their "
                                              "inputs' shapes.")(f)
    f = click.option("--input-value", "input_value", multiple=True, metavar="NAME=V1,V2..",
                     help="Value of an integer input that decides shapes or branches (a shape tensor, a k, a "
                          "sample rate), for the run that finds shapes static inference leaves unknown "
                          "(repeatable).")(f)
    return f


def variant_options(f):
    """What each layer expands into; shared by generate and db lookup so both mean the same."""
    f = click.option("--no-fusion", is_flag=True, help="Do not generate fused-layer variants.")(f)
    f = click.option("--math", "maths", multiple=True, metavar="M",
                     help="cuDNN/cuBLAS math modes (fma, tf32_allowed, tensor_op); default: per dtype.")(f)
    f = click.option("--layout", "layouts", multiple=True, metavar="L",
                     help="Layouts (cudnn: nchw, nhwc; onednn: nchw, nhwc, any).")(f)
    f = click.option("--dtype", "dtypes", multiple=True, metavar="DT",
                     help="Data types (f32, f16, bf16); default: the backend's (cudnn f32+f16, onednn "
                          "f32+bf16 where the CPU has it).")(f)
    return f


def offered(backend: str) -> dict[str, tuple[str, ...]]:
    """The values each variant option takes on a backend."""
    from .generator import get_backend

    b = get_backend(backend)
    return {"--dtype": b.dtypes, "--layout": b.layouts, "--math": b.maths}


def gen_options_for(backend: str, dtypes: tuple[str, ...], layouts: tuple[str, ...], maths: tuple[str, ...],
                    fusion: bool, strict: bool, **extra) -> GenOptions | None:
    """GenOptions holding only what ``backend`` offers. ``strict`` (one backend named): any value
    it does not offer is an error saying what it offers; otherwise (several backends) such a
    backend is skipped (None) when none of a list's values apply to it."""
    from .errors import UsageError
    from .generator import GenOptions

    picked: dict[str, tuple[str, ...]] = {}
    for flag, asked in (("--dtype", dtypes), ("--layout", layouts), ("--math", maths)):
        choices = offered(backend)[flag]
        bad = [v for v in asked if v not in choices]
        if bad and strict:
            what = f"offers {', '.join(choices)}" if choices else "has no such option"
            raise UsageError(f"{flag} {', '.join(bad)}: the {backend} backend {what}")
        picked[flag] = tuple(v for v in asked if v in choices)
        if asked and choices and not picked[flag]:
            return None
    return GenOptions(dtypes=picked["--dtype"], layouts=picked["--layout"], math=picked["--math"],
                      fusion=fusion, **extra)


def check_known(dtypes: tuple[str, ...], layouts: tuple[str, ...], maths: tuple[str, ...],
                backends: list[str]) -> None:
    """Every value must be offered by at least one of ``backends``."""
    from .errors import UsageError

    for flag, asked in (("--dtype", dtypes), ("--layout", layouts), ("--math", maths)):
        known = {v for b in backends for v in offered(b)[flag]}
        bad = [v for v in asked if v not in known]
        if bad:
            listing = "; ".join(f"{b}: {', '.join(offered(b)[flag]) or 'none'}" for b in backends)
            raise UsageError(f"{flag} {', '.join(bad)}: no backend offers it ({listing})")


# --- zoo ---------------------------------------------------------------------------------

@main.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="models",
              show_default=True, help="Folder to write <name>.onnx files into.")
@click.option("--only", multiple=True, metavar="NAME", help="Build only these models (repeatable).")
@click.option("--list", "list_only", is_flag=True, help="List the reference models and exit.")
@click.option("--table", "table_only", is_flag=True,
              help="Build in memory and compare layers and MACs with the paper's Table I; write nothing.")
def zoo(out_dir: str, only: tuple[str, ...], list_only: bool, table_only: bool) -> None:
    """Build the paper's 30 reference models (Table I) as ONNX files, offline and deterministically.

    The models follow the ONNX Model Zoo versions the paper used, with random weights.
    """
    from rich.progress import Progress
    from rich.table import Table

    from . import zoo as zoo_mod

    if list_only:
        table = Table("id", "name", "task", "paper MACs", "paper layers")
        for m in zoo_mod.MODELS:
            table.add_row(str(m.id), m.name, m.task, f"{m.paper_macs / 1e9:.3g}G", str(m.paper_layers))
        console.print(table)
        return
    if table_only:
        _zoo_table(zoo_mod, list(only) or None)
        return
    names = list(only) or None
    with Progress(console=err_console, transient=True) as progress:
        total = len(names) if names else len(zoo_mod.MODELS)
        task = progress.add_task("building models", total=total)

        def step(name: str) -> None:
            progress.update(task, advance=1, description=f"built {name}")

        paths = zoo_mod.build_all(out_dir, names=names, progress=step)
    for p in paths:
        console.print(str(p), highlight=False)


def _zoo_table(zoo_mod, names: list[str] | None) -> None:
    from rich.table import Table

    from .processor import load_model

    table = Table("id", "name", "paper layers", "built layers", "paper MACs", "built MACs", "MACs Δ",
                  title="reference models vs Table I (* deviation, explained below)")
    notes: list[str] = []
    for m in (zoo_mod.MODELS if not names else [zoo_mod.get(n) for n in names]):
        built = load_model(m.build(), name=m.name)
        delta = 100.0 * (built.macs - m.paper_macs) / m.paper_macs
        why = [n for n in (m.layers_note, m.macs_note) if n]
        notes.extend(f"{m.name}: {n}" for n in why)
        table.add_row(str(m.id), m.name + (" *" if why else ""), str(m.paper_layers),
                      str(len(built.nodes)), f"{m.paper_macs / 1e9:.3f}G", f"{built.macs / 1e9:.3f}G",
                      f"{delta:+.1f}%")
    console.print(table)
    for note in notes:
        console.print(f"* {note}", highlight=False)


# --- generate ----------------------------------------------------------------------------

@main.command()
@click.argument("models", nargs=-1, required=True, type=click.Path())
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="out/bench",
              show_default=True, help="Folder for layers.json and generated benchmark sources.")
@batch_options
@value_options
@click.option("--backend", type=click.Choice(["all", "cudnn", "onednn", "onnxruntime", "torch", "none"]),
              default="all", show_default=True,
              help="Which library's benchmarks to generate ('all': cudnn and onednn; onnxruntime, torch: the "
                   "layers through the framework's own kernels; 'none': manifest only).")
@variant_options
@click.option("--cupti", is_flag=True, help="cuDNN: CUPTI kernel-metrics mode instead of timing.")
@click.option("--cupti-metric", "cupti_metrics", multiple=True, metavar="NAME",
              help="CUPTI metric to record per kernel in --cupti mode (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON on stdout.")
def generate(models: tuple[str, ...], out_dir: str, batch_size: int, input_shape: tuple[str, ...],
             input_value: tuple[str, ...], input_data: str | None, backend: str, dtypes: tuple[str, ...],
             layouts: tuple[str, ...], maths: tuple[str, ...], no_fusion: bool, cupti: bool,
             cupti_metrics: tuple[str, ...], as_json: bool) -> None:
    """Process ONNX models into their unique layers and write the benchmark manifest.

    Prints, per model, its layers, unique layers and, for each backend generated, the share of
    its running layers that backend's benchmarks cost, plus the union across models, and writes
    OUT/layers.json (keys, parameters, shapes, occurrences).
    A file that cannot be processed gets one error line; the others are still processed and
    the exit status is non-zero.
    """
    from .generator import LIBRARY_BACKENDS
    from .generator import generate as generate_backend
    from .layers import unique_layers
    from .manifest import build_manifest, write_manifest
    from .model_inputs import input_shapes_per_model, input_values_per_model
    from .model_stats import coverage_notes, model_stats, total_stats
    from .processor import load_model
    from .shapes_by_execution import (
        execution_json,
        load_input_data,
        shape_notes,
        uncosted_notes,
    )

    names = [] if backend == "none" else list(LIBRARY_BACKENDS) if backend == "all" else [backend]
    if len(names) != 1:
        check_known(dtypes, layouts, maths, names or list(LIBRARY_BACKENDS))
    options = {name: gen_options_for(name, dtypes, layouts, maths, not no_fusion, strict=len(names) == 1,
                                     cupti=cupti, cupti_metrics=cupti_metrics) for name in names}
    shapes = input_shapes_per_model(input_shape, models)
    values = input_values_per_model(input_value, models)
    data = load_input_data(input_data) if input_data else {}
    loaded, failed = [], 0
    for path in models:
        try:
            loaded.append(load_model(path, batch_size=batch_size, input_shapes=shapes[path],
                                     input_values=values[path], input_data=data))
        except BenanzaError as exc:
            failed += 1
            print_error(exc)
    uniques = unique_layers(loaded)
    stats = [model_stats(m) for m in loaded]
    total = total_stats(loaded)
    generated = []
    if loaded:
        manifest = build_manifest(loaded, uniques)
        write_manifest(manifest, out_dir)
        generated = [generate_backend(manifest, name, out_dir, opts, loaded) for name, opts in options.items() if opts]
    if as_json:
        echo_json({"models": [{**s.to_json(), **execution_json(m)} for s, m in zip(stats, loaded)],
                   "total": total.to_json()})
    elif loaded:  # with every model failed there is nothing to tabulate: the errors said it all
        libraries = [n for n in names if n in LIBRARY_BACKENDS]
        _print_stats(stats, total, libraries)
        for m in loaded:
            for note in shape_notes(m) + uncosted_notes(m) + coverage_notes(m, libraries):
                console.print(f"{m.name}: {note}", highlight=False, soft_wrap=True)
        console.print(f"manifest: {Path(out_dir) / 'layers.json'} ({len(uniques)} unique layers)",
                      highlight=False)
        for g in generated:
            console.print(f"{g.backend}: {len(g.variants)} benchmark variants in {g.out_dir}",
                          highlight=False)
        for name, opts in options.items():
            if opts is None:
                console.print(f"{name}: nothing generated (it offers dtypes {', '.join(offered(name)['--dtype'])}; "
                              f"layouts {', '.join(offered(name)['--layout'])}; math modes "
                              f"{', '.join(offered(name)['--math']) or 'none'})", highlight=False)
    if failed:
        sys.exit(1)


def _print_stats(stats, total, backends: list[str]) -> None:
    """Coverage is the share of the layers that run (free views and folded constants excluded),
    for each backend generated (all of them when none is)."""
    from rich.table import Table

    shown = backends or [b.backend for b in total.backends]
    table = Table("model", "layers", "unique", "% unique", "running",
                  *(f"% covered {b}" for b in shown), "free", "folded", "MACs",
                  *(f"not covered by {b} (op×n)" for b in shown), title="layers per model")
    for s in stats + [total]:
        cover = [s.backend(b) for b in shown]
        table.add_row(s.model, str(s.layers), str(s.unique_layers), f"{s.unique_pct:.1f}", str(s.running_layers),
                      *(f"{c.covered_pct:.1f}" for c in cover), str(s.free_layers), str(s.folded_layers),
                      f"{s.macs / 1e9:.3f}G", *(", ".join(f"{op}×{n}" for op, n in c.not_covered) for c in cover),
                      end_section=s is stats[-1])
    console.print(table)


# --- run ---------------------------------------------------------------------------------

def db_option(f):
    return click.option("--db", "db_path", metavar="FILE",
                        help="Performance database (default: $BENANZA_DB, else perfdb/benanza.db).")(f)


@main.command()
@click.option("--system", "system_name", required=True, metavar="NAME",
              help="Name the results are stored under (hardware and stack are detected).")
@click.option("--bench-dir", type=click.Path(file_okay=False), default="out/bench", show_default=True,
              help="Folder `benanza generate --out` wrote.")
@click.option("--backend", type=click.Choice(["auto", "onednn", "cudnn", "onnxruntime", "torch"]), default="auto",
              show_default=True, help="auto: cudnn when a CUDA device is present, else onednn.")
@db_option
@click.option("--filter", "name_filter", metavar="REGEX", help="Only benchmarks whose name matches.")
@click.option("--dry-run", is_flag=True, help="Show what would run, build and run nothing.")
@click.option("--force", is_flag=True, help="Re-run benchmarks already measured on this system and stack.")
@click.option("--remeasure-contended", is_flag=True,
              help="Run only the benchmarks whose latest result on this system and stack is flagged contended "
                   "(nothing missing, no peaks): what `analyze` refused prints this.")
@click.option("--min-time", type=FiniteRange(min=0.0, min_open=True), default=0.2, show_default=True,
              help="Seconds per repetition of the fixed budget, which giving it or --repetitions (and not "
                   "--precision) selects (Google Benchmark min time; cuDNN sizes each repetition to about 1 ms "
                   "of GPU time; the in-process backends always use it).")
@click.option("--repetitions", type=click.IntRange(min=1), default=3, show_default=True,
              help="Repetitions of the fixed budget (see --min-time).")
@click.option("--threads", type=click.IntRange(min=1),
              help="CPU threads (oneDNN: OpenMP; onnxruntime, torch: intra-op); default: the cores other work leaves "
                   "free when the run starts.")
@click.option("--timeout", type=FiniteRange(min=0.0, min_open=True), default=300.0, show_default=True,
              help="Seconds one benchmark may take before it is killed and stored as failed.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), help="Parallel build jobs (default: all cores).")
@click.option("--max-rsd", type=FiniteRange(min=0.0, min_open=True), default=UNSTABLE_RSD, show_default=True,
              help="Relative stddev (stddev / median of the repetitions) above which a result is unstable.")
@click.option("--remeasure", type=click.IntRange(min=0), default=2, show_default=True,
              help="Times an unstable or contended result is measured again, after the others; what stays "
                   "so is flagged.")
@click.option("--max-contention", type=FiniteRange(min=0.0, max=1.0), default=MAX_CONTENTION,
              show_default=True,
              help="Share of a CPU benchmark's runnable time its threads may wait for a CPU (or have stolen) "
                   "before its result is contended (docs/measurement.md).")
@click.option("--max-failures", type=click.IntRange(min=1), default=3, show_default=True,
              help="A variant that failed this many runs in a row is skipped (--force retries it).")
@click.option("--l2", type=click.Choice(["flush", "hot"]), default="flush", show_default=True,
              help="cuDNN: flush the GPU's L2 cache before every timed call, or time with a hot cache "
                   "(stored in each result's l2_flushed counter; re-measure with --force).")
@click.option("--cold-cache", is_flag=True, default=False,
              help="torch, onnxruntime: evict the CPU's last-level cache before every timed call, so a layer reads "
                   "its data from memory as inside a whole model; stored as its own stack (cache=cold), never "
                   "mixed with warm results (docs/run.md).")
@click.option("--cold-weights", is_flag=True, default=False,
              help="torch, onnxruntime: as --cold-cache, then read the layer's inputs back before every timed call, "
                   "so only its weights come from memory, as inside a whole model too big for the cache; stored as "
                   "its own stack (cache=cold-weights) (docs/run.md).")
@click.option("--peaks/--no-peaks", "measure_peaks", default=True, show_default=True,
              help="Measure the stack's peaks (`benanza peaks`, a few seconds) when the database has none.")
@click.option("--precision", type=FiniteRange(min=0.0, min_open=True), default=DEFAULT_PRECISION,
              show_default=True,
              help="Sample each oneDNN benchmark adaptively until its 10th percentile is known to this relative "
                   "precision (95% interval half-width) instead of a fixed --min-time × --repetitions, which "
                   "giving either of those selects (docs/measurement.md); the stability check then reads the "
                   "precision reached.")
@click.option("--max-time", type=FiniteRange(min=0.0, min_open=True), default=MAX_SAMPLING_SECONDS,
              show_default=True, help="With --precision: the most seconds one benchmark samples.")
@click.option("--race/--no-race", default=True, show_default=True,
              help="With --precision: screen every variant at a quarter of --max-time first and stop those that "
                   "cannot be their layer's best (stored eliminated, with their estimate); --no-race samples "
                   "every variant in full, for studies.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the shuffled order the benchmarks are measured in (stored in each result's command).")
@click.option("--first", "first_files", multiple=True, type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help="Benchmarks named in FILE (one a line) run before the others, each group in the seeded order; "
                   "repeatable: the first file's before the second's. For a run that may be stopped.")
def run(system_name: str, bench_dir: str, backend: str, db_path: str | None, name_filter: str | None,
        dry_run: bool, force: bool, remeasure_contended: bool, min_time: float, repetitions: int, threads: int | None,
        timeout: float, jobs: int | None, max_rsd: float, remeasure: int, max_contention: float, max_failures: int,
        l2: str, cold_cache: bool, cold_weights: bool, measure_peaks: bool, precision: float | None, max_time: float,
        race: bool, seed: int, first_files: tuple[str, ...]) -> None:
    """Build the generated benchmarks, run those the database lacks, and store the results.

    Incremental: variants with an ok or unsupported result on this system and software stack
    are skipped (unless --force); failed ones are retried. Results are stored as they
    arrive: Ctrl-C keeps them and a re-run continues where it stopped. A benchmark that
    crashes or hangs is stored as failed. oneDNN benchmarks are sampled until --precision,
    racing each layer's variants; --min-time or --repetitions select a fixed budget. A result
    short of the precision (or, with a fixed budget, whose repetitions disagree by more than
    --max-rsd) is measured again, and flagged unstable if it stays so; one whose threads lost
    more than --max-contention of their time to other processes is measured again after the
    others, and flagged contended if it stays so (`analyze` then refuses its bound).
    """
    import shlex

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from . import runner
    from .children import sigterm_interrupts
    from .errors import UsageError
    from .perfdb import remeasure_flags, resolve_db_path

    # The order is part of how a result was measured: the seed in effect is in the stored command.
    given_seed = any(a == "--seed" or a.startswith("--seed=") for a in sys.argv[1:])
    command = " ".join(["benanza", *sys.argv[1:], *([] if given_seed else ["--seed", str(seed)])])
    first = tuple(_names_file(path) for path in first_files)
    if cold_cache and cold_weights:
        raise UsageError("--cold-cache evicts a layer's inputs, --cold-weights keeps them warm: give one")
    ctx = click.get_current_context()
    if ctx.get_parameter_source("precision") == click.core.ParameterSource.DEFAULT and any(
            ctx.get_parameter_source(o) != click.core.ParameterSource.DEFAULT for o in ("min_time", "repetitions")):
        precision = None  # a fixed budget asked for
    options = runner.RunOptions(filter=name_filter, dry_run=dry_run, force=force, first=first,
                                remeasure_contended=remeasure_contended, min_time=min_time,
                                repetitions=repetitions, threads=threads, timeout=timeout, build_jobs=jobs,
                                command=command, seed=seed, precision=precision, max_time=max_time, race=race,
                                max_rsd=max_rsd,
                                remeasure=remeasure, max_failures=max_failures, l2=l2, peaks=measure_peaks,
                                max_contention=max_contention,
                                cache="cold" if cold_cache else "cold-weights" if cold_weights else "warm")
    path = resolve_db_path(db_path)
    if dry_run:
        summary = runner.run(bench_dir, system_name, backend, path, options)
        _print_threads(summary)
        for name in summary.to_run:
            console.print(name, highlight=False, soft_wrap=True)
        console.print(f"{summary.backend} on {summary.system.device}: {len(summary.to_run)} of "
                      f"{summary.total} benchmarks would run ({summary.already} already in {path})",
                      highlight=False)
        expected = _duration(sum(summary.expected.values()))
        budget = (f"about {expected} of timed loops at --min-time {min_time:g} s × {repetitions} repetitions"
                  if summary.precision is None else
                  f"from about {expected} (each benchmark at its fewest samples) to at most "
                  f"{_duration(summary.at_most_s)} (each sampling --max-time {max_time:g} s) at --precision "
                  f"{precision:g}")
        console.print(f"expected time: {budget} ({summary.from_earlier} of {len(summary.to_run)} timed from earlier "
                      f"results of {system_name}; setup, start-up and the build not counted)", highlight=False)
        _print_gave_up(summary, max_failures)
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("ok {task.fields[ok]} unsup {task.fields[unsupported]} failed {task.fields[failed]}"),
               TextColumn("{task.fields[left]}"))
    counts = {"ok": 0, "unsupported": 0, "failed": 0}
    if not err_console.is_terminal:  # a log file or a CI job: no bar to draw, so say at a steady pace
        with _ProgressLines(counts) as lines, sigterm_interrupts():
            summary = runner.run(bench_dir, system_name, backend, path, options, progress=lines.step)
    else:
        with Progress(*columns, console=err_console, transient=True) as bar:
            task = bar.add_task("building", total=None, ok=0, unsupported=0, failed=0, left="")

            def step(p: runner.Progress) -> None:
                if p.status is not None:
                    counts[p.status.value] += 1
                bar.update(task, total=p.total, completed=p.done, description="running",
                           ok=counts["ok"], unsupported=counts["unsupported"], failed=counts["failed"],
                           left="" if p.left_s is None else f"about {_duration(p.left_s)} left")

            with sigterm_interrupts():
                summary = runner.run(bench_dir, system_name, backend, path, options, progress=step)
    _print_threads(summary)
    _print_failures(summary.failures)
    console.print(f"{summary.backend} on {summary.system.device} (stack {summary.system.stack_id}): "
                  f"{summary.stored} stored ({summary.ok} ok, {summary.unsupported} unsupported, "
                  f"{summary.failed} failed), {summary.already} already measured, "
                  f"{summary.seconds:.1f}s → {path}", highlight=False)
    if summary.eliminated:
        err_console.print(f"{summary.eliminated} variants stopped early: they cannot be their layer's best "
                          f"(stored eliminated, with their estimate; --no-race measures them in full)",
                          highlight=False)
    if summary.remeasured or summary.unstable:
        spread = (f"vary by more than {max_rsd:.0%} (relative stddev)" if summary.precision is None else
                  f"reached no --precision {precision:g} in --max-time {max_time:g} s")
        err_console.print(f"{summary.remeasured} unstable or contended results re-measured; {summary.unstable} still "
                          f"{spread} and are flagged unstable in the database", highlight=False)
    _print_gave_up(summary, max_failures)
    if remeasure_contended and not summary.to_run:
        print_warning(f"no result of stack {summary.system.stack_id} among these {summary.total} benchmarks is "
                      f"flagged contended: nothing was re-measured (`benanza db info` lists the stacks; another "
                      f"--threads is another stack)")
    if summary.peaks is not None:
        err_console.print(f"peaks of this stack measured and stored: {_peaks_line(summary.peaks)}", highlight=False)
        _warn_contended_peaks(summary.peaks)
    elif summary.peaks_error:
        print_warning(f"the stack's peaks were not measured ({summary.peaks_error}): analyses of it have no "
                      f"speed-of-light bound")
    if summary.still_contended:
        print_warning(
            f"{len(summary.still_contended)} results lost more than {max_contention:.0%} of their time to other "
            f"processes in every measurement ({summary.contended:.0%} of this run's measurements did) and are "
            f"stored as contended; `benanza analyze` gives no bound resting on them. When the machine is "
            f"idle: " + shlex.join(["benanza", "run", "--system", system_name, "--backend", summary.backend,
                                    "--bench-dir", bench_dir, "--db", str(path),
                                    *remeasure_flags(summary.threads)]))
    if summary.interrupted:
        err_console.print("interrupted: results so far are stored; run the same command to continue")
        sys.exit(130)


def _names_file(path: str) -> tuple[str, ...]:
    """The benchmark names of a ``--first`` file, one a line (blank lines skipped)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise FileProblem(path, f"--first: not a readable text file of benchmark names ({exc})") from None
    return tuple(line.strip() for line in text.splitlines() if line.strip())


class _ProgressLines:
    """``run``'s progress as a line every ``every`` seconds (and at the last benchmark) when stderr
    is not a terminal: benchmarks done, their statuses, time spent and an estimate of the time left
    (the runner's, from each benchmark's expected time; without one, the mean time per benchmark
    since the pass's first one started, the build excluded, times those left). A pass that
    re-measures unstable or contended results counts on its own. Inside ``with``, the build
    before the first benchmark (minutes for a large bench dir, longer when another run holds the
    build lock) says so at the same pace."""

    def __init__(self, counts: dict[str, int], every: float = 30.0, clock=None) -> None:
        import threading
        import time

        self.counts, self.every, self.clock = counts, every, clock or time.monotonic
        self.started = self.last = self.clock()
        self.first: float | None = None  # when the pass's first benchmark started
        self.total: int | None = None  # the pass's benchmarks
        self.done = 0
        self.label = "run"
        self.measuring = threading.Event()  # set at the first benchmark, or when the run ends
        self.beat = threading.Thread(target=self._building, daemon=True)

    def __enter__(self) -> _ProgressLines:
        self.beat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.measuring.set()
        self.beat.join()

    def _building(self) -> None:
        while not self.measuring.wait(self.every):
            err_console.print(f"{self.label}: building, {_duration(self.clock() - self.started)} spent",
                              highlight=False, soft_wrap=True)

    def step(self, p) -> None:
        self.measuring.set()
        now = self.clock()
        if self.total is not None and (p.total != self.total or p.done < self.done):  # the next pass
            self.label, self.first = "re-measure", None
            self.counts.update(dict.fromkeys(self.counts, 0))
        self.total, self.done = p.total, p.done
        if self.first is None:
            self.first = now
        if p.status is not None:
            self.counts[p.status.value] += 1
        if p.status is None or (now - self.last < self.every and p.done < p.total):
            return
        self.last = now
        spent = now - self.started
        if p.left_s is not None:
            left = p.left_s
        else:
            left = (now - self.first) / p.done * (p.total - p.done) if p.done else 0.0
        c = self.counts
        err_console.print(f"{self.label}: {p.done}/{p.total} benchmarks (ok {c['ok']}, unsupported "
                          f"{c['unsupported']}, failed {c['failed']}), {_duration(spent)} spent, about "
                          f"{_duration(left)} left", highlight=False, soft_wrap=True)


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


@main.command()
@click.option("--system", "system_name", required=True, metavar="NAME",
              help="Name the peaks are stored under, with the detected stack (as `benanza run`).")
@click.option("--backend", type=click.Choice(["auto", "onednn", "cudnn"]), default="auto", show_default=True,
              help="auto: cudnn when a CUDA device is present, else onednn.")
@click.option("--threads", type=click.IntRange(min=1), help="CPU threads (oneDNN); default all cores.")
@db_option
@click.option("--json", "as_json", is_flag=True, help="Print the peaks as JSON on stdout.")
def peaks(system_name: str, backend: str, threads: int | None, db_path: str | None, as_json: bool) -> None:
    """Measure the stack's attainable peaks and store them with it (a re-run replaces them).

    GEMM throughput per data type the library runs here (f32, bf16, int8: what the CPU lacks is
    reported as the library's refusal), the cores' own f32 FMA throughput (the f32 compute roof:
    the library's GEMM is printed beside it) and streaming bandwidth from the L1 cache to main
    memory; on a GPU (cudnn) cuBLAS GEMMs (f32, tf32, f16, bf16, int8) and device-memory
    bandwidth inside and beyond L2, beside the GPU's datasheet figures where it is a known one.
    `benanza analyze` holds every layer to these roofs (docs/speed-of-light.md).
    """
    from rich.table import Table
    from rich.text import Text

    from .generator import get_backend
    from .peaks import datasheet_for, measure
    from .perfdb import PerfDB, resolve_db_path
    from .runner import check_device, resolve_backend
    from .system import default_threads, detect_system

    backend = resolve_backend(backend)
    check_device(backend)
    threads = threads or default_threads()
    path = resolve_db_path(db_path)
    with PerfDB(path) as db:  # a database that cannot be written is refused before measuring
        context, measured = measure(backend, threads, command=" ".join(["benanza", *sys.argv[1:]]))
        overrides = get_backend(backend).stack_overrides(context)
        system = detect_system(system_name, backend, threads=threads, overrides=overrides)
        db.store_peaks(system, measured)
    sheet = datasheet_for(system.device) if backend == "cudnn" else None
    if as_json:
        click.echo(json.dumps({"system": system_name, "stack_id": system.stack_id, "device": system.device,
                               **measured.to_json(), "datasheet": _datasheet_json(sheet)}, indent=1))
        _warn_contended_peaks(measured)
        return
    who = f"{threads} threads" if backend == "onednn" else backend
    columns = ["peak", "value", "size", "implementation / level"] + ([f"datasheet ({sheet.name})"] if sheet else [])
    table = Table(*columns, title=Text(f"{system.device}, {who} (stack {system.stack_id})"))

    def reference(dtype: str = "", level: str = "") -> list[str]:
        """The datasheet's figure beside a measured peak (a column only when the GPU is known)."""
        if sheet is None:
            return []
        if dtype:
            value = sheet.gemm(dtype)
            return [f"{value:g} TFLOP/s" if value else "—"]
        return [f"{sheet.memory_gb_s:g} GB/s" if level == "DRAM" else ""]

    # the cores' FMA peak first where measured: the dtype's compute roof unless the library's GEMM,
    # printed beside it, measured faster
    for p in sorted((p for p in measured.peaks if p.kind != "bandwidth"), key=lambda p: p.kind != "fma"):
        fma = p.kind == "fma"
        roof = " (compute roof)" if fma and measured.compute_peak(p.dtype) == p else ""
        table.add_row(Text(f"FMA {p.dtype}{roof}" if fma else f"library GEMM {p.dtype}"),
                      f"{p.value / 1e12:.3f} TFLOP/s", f"{p.size}-bit" if fma else f"{p.size}³",
                      Text(p.implementation), *reference(dtype="" if fma else p.dtype))
    for dtype, message in measured.unsupported:
        table.add_row(Text(f"library GEMM {dtype}"), "not run", "", Text(message), *reference(dtype=dtype))
    for p in measured.ladder:
        table.add_row(Text("bandwidth"), f"{p.value / 1e9:.1f} GB/s", f"{p.size / 2**20:.3g} MiB", p.level,
                      *reference(level=p.level))
    console.print(table)
    if sheet:
        console.print(f"datasheet figures: {sheet.source} (dense, boost clock): a reference, not a roof",
                      highlight=False)
    console.print(f"stored in {path}", highlight=False)
    _warn_contended_peaks(measured)


def _datasheet_json(sheet) -> dict | None:
    if sheet is None:
        return None
    return {"name": sheet.name, "source": sheet.source, "tflops": dict(sheet.tflops),
            "memory_bytes_per_s": sheet.memory_gb_s * 1e9, "l2_bytes": int(sheet.l2_mb * 2**20)}


def _warn_contended_peaks(p) -> None:
    if not p.trusted:
        print_warning(f"other processes competed for the CPU during {p.contended:.0%} of the measurement: the "
                      f"peaks are too low to judge by, so analyses give no speed-of-light bound from them. Re-run "
                      f"`benanza peaks` on an idle machine to replace them.")


def _peaks_line(p) -> str:
    compute = ", ".join(f"{x.label} {x.value / 1e12:.3g} TFLOP/s" for x in p.peaks if x.kind != "bandwidth")
    dram, llc = p.dram, p.llc
    return (f"{compute}; bandwidth {dram.value / 1e9:.3g} GB/s to memory"
            + (f", {llc.value / 1e9:.3g} GB/s in the last-level cache" if llc else "")) if dram else compute


@main.command("check")
@click.argument("models", nargs=-1, required=True, type=click.Path())
@click.option("--bench-dir", type=click.Path(file_okay=False), default="out/bench", show_default=True,
              help="Folder `benanza generate --out` wrote for these models.")
@click.option("--backend", type=click.Choice(["onednn", "onnxruntime", "torch"]), default="onednn",
              show_default=True,
              help="Whose benchmarks to check (onnxruntime, torch: each variant's subgraph as it runs it against "
                   "the same nodes run by ONNX Runtime unoptimized).")
@batch_options
@click.option("--filter", "name_filter", metavar="REGEX", help="Only benchmarks whose name matches.")
@click.option("--seed", type=click.IntRange(min=0, max=2**24 - 1), default=0, show_default=True,
              help="Seed of the input generator (both the benchmarks and the reference use it).")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="oneDNN (onnxruntime, torch: intra-op) threads.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), help="Parallel build jobs (default: all cores).")
@click.option("--timeout", type=FiniteRange(min=0.0, min_open=True), default=600.0, show_default=True,
              help="Seconds the benchmarks may take in all.")
@click.option("--show-ok", is_flag=True, help="Also print a line for every benchmark that passed.")
def check_command(models: tuple[str, ...], bench_dir: str, backend: str, batch_size: int,
                  input_shape: tuple[str, ...], name_filter: str | None, seed: int, threads: int, jobs: int | None,
                  timeout: float, show_ok: bool) -> None:
    """Check what the oneDNN benchmarks compute (benchdnn's correctness mode).

    Each benchmark runs once on inputs from a seeded generator and its outputs are compared with
    ONNX Runtime running the same layer, or the fusion pattern's nodes, taken from MODELS (the
    models the benchmarks were generated from) on the same inputs; with --backend onnxruntime,
    each variant's subgraph at its optimization level (fusions, NCHWc) against the same nodes run
    unoptimized (--backend torch: in its layout, dtype and oneDNN setting, against the same).
    One line per mismatch, with the command that reproduces it; exit status 1 when any benchmark
    mismatched or failed.
    """
    import shlex

    from .check import CheckOptions, CheckStatus, check, check_subgraphs
    from .model_inputs import input_shapes_per_model
    from .processor import load_model

    command = shlex.join(["benanza", "check", *models, "--bench-dir", bench_dir, "--batch-size", str(batch_size),
                          *(f"--input-shape={s}" for s in input_shape), *(["--backend", backend]
                                                                          if backend != "onednn" else [])])
    options = CheckOptions(filter=name_filter, seed=seed, threads=threads, timeout=timeout, build_jobs=jobs,
                           command=command)
    if backend != "onednn":  # their subgraphs were cut from MODELS at generate time, with their constants
        results = check_subgraphs(bench_dir, backend, options)
    else:
        per_model = input_shapes_per_model(input_shape, models)
        # the check maps layers back onto each file's own graph: an If stays one node there
        loaded = [load_model(p, batch_size=batch_size, input_shapes=per_model[p], take_branches=False)
                  for p in models]
        results = check(bench_dir, loaded, options)
    for r in results:
        if r.status is CheckStatus.MISMATCH:
            err_console.print(f"mismatch: {r.name}: {r.compared}: error {r.error:.3g} > {r.tolerance:g} at "
                              f"{r.where}\n  reproduce: {r.reproduce}", highlight=False, soft_wrap=True)
        elif r.status is CheckStatus.FAILED:
            err_console.print(f"failed: {r.name}: {r.compared}\n  reproduce: {r.reproduce}", highlight=False,
                              soft_wrap=True)
        elif r.status is CheckStatus.NOT_CHECKED:
            err_console.print(f"not checked: {r.name}: {r.compared}", highlight=False, soft_wrap=True)
        elif r.status is CheckStatus.OK and show_ok:
            console.print(f"ok: {r.name}: {r.compared} (error {r.error:.3g} ≤ {r.tolerance:g})", highlight=False,
                          soft_wrap=True)
    counts = {s: sum(r.status is s for r in results) for s in CheckStatus}
    console.print(f"checked {len(results)} benchmarks (seed {seed}): " + ", ".join(
        f"{n} {s.value.replace('_', ' ')}" for s, n in counts.items()), highlight=False)
    if counts[CheckStatus.MISMATCH] or counts[CheckStatus.FAILED]:
        sys.exit(1)


_FAILURES_SHOWN = 20


def _print_failures(failures) -> None:
    """Each failed benchmark with the line that reproduces it (also stored with the result)."""
    for f in failures[:_FAILURES_SHOWN]:
        err_console.print(f"failed: {f.name}: {f.message}\n  reproduce: {f.reproduce}", highlight=False,
                          soft_wrap=True)
    if len(failures) > _FAILURES_SHOWN:
        err_console.print(f"… and {len(failures) - _FAILURES_SHOWN} more failures: `benanza db list --status "
                          f"failed` shows them, their results' metrics hold the reproduce lines", highlight=False)


def _print_threads(summary) -> None:
    """Say how many threads the benchmarks use when the run chose them."""
    free = summary.free
    if free is None:  # given, or a GPU run
        return
    idle = f"{free.idle:.1f} of {free.allowed} cores idle now"
    if summary.threads_kept:
        busy = "; other work may contend, and what it spoils is re-measured" if free.free < summary.threads else ""
        err_console.print(f"threads: {summary.threads}, those of the stack already measured under "
                          f"{summary.system.name!r} ({idle}{busy}); --threads N sets them", highlight=False)
    else:
        err_console.print(f"threads: {summary.threads}, the cores other work left free when the run started "
                          f"({idle}); --threads N sets them", highlight=False)


def _print_gave_up(summary, max_failures: int) -> None:
    if summary.gave_up:
        err_console.print(
            f"note: {len(summary.gave_up)} variants failed {max_failures} runs in a row and were skipped "
            f"(--force retries them): {', '.join(summary.gave_up[:3])}{', …' if len(summary.gave_up) > 3 else ''}",
            highlight=False, soft_wrap=True)


# --- db ----------------------------------------------------------------------------------

@main.group()
def db() -> None:
    """Inspect, export, merge and serve performance databases."""


@db.command("info")
@db_option
def db_info(db_path: str | None) -> None:
    """Schema version, row counts and the systems stored."""
    from rich.table import Table

    from .perfdb import PerfDB, resolve_db_path

    path = resolve_db_path(db_path)
    with PerfDB(path, readonly=True) as pdb:
        console.print(f"{path}: schema {pdb.schema_version}", highlight=False)
        table = Table("table", "rows")
        for c in pdb.counts():
            table.add_row(c.table, str(c.rows))
        console.print(table)
        systems = Table("system", "backend", "device", "stack id", "stack")
        for s in pdb.systems():
            systems.add_row(s.name, s.backend, s.device, s.stack_id, ", ".join(f"{k}={v}" for k, v in s.stack))
        console.print(systems)


@db.command("list")
@db_option
@click.option("--system", "system_name", required=True, metavar="NAME")
@click.option("--backend", type=click.Choice(["onednn", "cudnn", "onnxruntime", "torch"]), default=None,
              help="Backend [default: that of the system's newest stack].")
@click.option("--stack", metavar="ID", default=None, help="Stack id or prefix [default: the newest].")
@click.option("--filter", "name_filter", metavar="REGEX", help="Only variants whose name matches.")
@click.option("--status", type=click.Choice(["ok", "unsupported", "failed"]), help="Only this status.")
def db_list(db_path: str | None, system_name: str, backend: str | None, stack: str | None,
            name_filter: str | None, status: str | None) -> None:
    """The latest result of every variant measured on one stack of a system."""
    import re

    from rich.table import Table

    from .perfdb import PerfDB, resolve_db_path
    from .sweep import resolve_system

    with PerfDB(resolve_db_path(db_path), readonly=True) as pdb:
        system = resolve_system(pdb, system_name, backend, stack)
        results = pdb.results(system)
    console.print(f"{system_name}: stack {system.stack_id} ({system.backend} on {system.device})", highlight=False)
    rx = re.compile(name_filter) if name_filter else None
    table = Table("variant", "status", "median ms", "rel. stddev", "implementation / message")
    for r in results:
        if (rx and not rx.search(r.variant.name)) or (status and r.status.value != status):
            continue
        rsd = f"{r.rsd:.1%}" + (" unstable" if r.unstable else "") if r.rsd is not None else ""
        table.add_row(r.variant.name, r.status.value, _ms4(r.median_ms), rsd,
                      r.implementation if r.ok else r.message + _reproduce(r.metrics))
    console.print(table)


def _ms4(x: float | None) -> str:
    return "" if x is None else f"{x:.4f}"


def _reproduce(metrics: dict) -> str:
    line = metrics.get("reproduce")
    return f"\nreproduce: {line}" if isinstance(line, str) else ""


@db.command("export")
@db_option
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False),
              help="Output file; .csv or .parquet.")
@click.option("--system", "system_name", metavar="NAME", help="Only this system.")
@click.option("--all", "all_rows", is_flag=True, help="Every stored measurement, not only the latest.")
def db_export(db_path: str | None, out_path: str, system_name: str | None, all_rows: bool) -> None:
    """Results joined with variants and layers, as CSV or Parquet (pandas; pyarrow for Parquet)."""
    from .errors import UsageError
    from .outputs import write_with
    from .perfdb import PerfDB, resolve_db_path

    with PerfDB(resolve_db_path(db_path), readonly=True) as pdb:
        frame = pdb.results_frame(system_name, latest=not all_rows)
    if out_path.endswith(".parquet"):
        try:
            write_with(out_path, lambda tmp: frame.to_parquet(tmp, index=False))
        except ImportError as exc:
            raise UsageError(f"Parquet export needs pyarrow: pip install pyarrow ({exc})") from None
    elif out_path.endswith(".csv"):
        write_with(out_path, lambda tmp: frame.to_csv(tmp, index=False))
    else:
        raise UsageError(f"{out_path}: choose a .csv or .parquet file name")
    console.print(f"{len(frame)} rows → {out_path}", highlight=False)


@db.command("merge")
@click.argument("target", type=click.Path(dir_okay=False))
@click.argument("sources", nargs=-1, required=True, type=click.Path(dir_okay=False))
def db_merge(target: str, sources: tuple[str, ...]) -> None:
    """Copy every row of SOURCES into TARGET (created if missing); nothing is lost or duplicated."""
    from .perfdb import PerfDB

    with PerfDB(target) as pdb:
        for src in sources:
            added = pdb.merge_from(src)
            console.print(f"{src}: " + ", ".join(f"{k} +{v}" for k, v in added.items()), highlight=False)
            if added["conflicts"]:
                err_console.print(f"warning: {added['conflicts']} rows of {src} differ from rows with the same key "
                                  f"in {target}; {target}'s rows stay in place, {src}'s are kept in its "
                                  f"merge_conflicts table", highlight=False)


@db.command("serve")
@db_option
@click.option("--port", type=int, default=8001, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; 0.0.0.0 publishes the database to the network (read-only).")
def db_serve(db_path: str | None, port: int, host: str) -> None:
    """Browse the database in a web page (Datasette; read-only: it only runs SELECT queries)."""
    import importlib.util

    from .errors import UsageError
    from .perfdb import SCHEMA_VERSION, PerfDB, check_idle_file, resolve_db_path, writer_active

    if importlib.util.find_spec("datasette") is None:
        raise UsageError("`benanza db serve` needs Datasette: pip install 'benanza[serve]'")
    # absolute: a file named like a flag (`./--root`) stays a file name
    path = resolve_db_path(db_path).absolute()
    # Immutable: neither the check nor Datasette creates -shm/-wal files beside it. Only a WAL
    # that a writer is still filling needs a read-only connection (that creates them) to be read.
    live = writer_active(path)
    if live or check_idle_file(path) < SCHEMA_VERSION:
        PerfDB(path, readonly=True).close()  # validates (and migrates an older schema)
    files = ["--", str(path)] if live else ["--immutable", str(path)]
    # exec, not a child process: a signal to `benanza db serve` must stop the server itself
    os.execv(sys.executable, [sys.executable, "-m", "datasette", "serve", "--host", host, "--port", str(port),
                              *files])


@db.command("lookup")
@click.argument("models", nargs=-1, required=True, type=click.Path())
@db_option
@click.option("--system", "system_name", required=True, metavar="NAME")
@click.option("--backend", type=click.Choice(["onednn", "cudnn", "onnxruntime", "torch"]), default=None,
              help="Library [default: the system's, as stored in the database].")
@batch_options
@value_options
@variant_options
@click.option("--bench-dir", type=click.Path(file_okay=False), default="out/bench", show_default=True)
@click.option("--generate-missing", is_flag=True, help="Generate and run the missing benchmarks now.")
def db_lookup(models: tuple[str, ...], db_path: str | None, system_name: str, backend: str | None,
              batch_size: int, input_shape: tuple[str, ...], input_value: tuple[str, ...], input_data: str | None,
              dtypes: tuple[str, ...], layouts: tuple[str, ...],
              maths: tuple[str, ...], no_fusion: bool, bench_dir: str, generate_missing: bool) -> None:
    """Check the database holds every benchmark the models need on a system (paper §III-C).

    The benchmarks expected are those `benanza generate` makes with the same options, for
    the system's backend: nothing is reported missing that a run was never asked to make.
    """
    from .errors import UsageError
    from .generator import expand_variants, get_backend
    from .layers import unique_layers
    from .manifest import build_manifest
    from .model_inputs import input_shapes_per_model, input_values_per_model, parse_input_shapes
    from .perfdb import PerfDB, missing_command, resolve_db_path
    from .processor import load_model
    from .shapes_by_execution import load_input_data, parse_input_value
    from .sweep import measure_missing

    path = resolve_db_path(db_path)
    stored = None
    known: list[str] = []
    if path.exists() or not generate_missing:
        with PerfDB(path, readonly=True) as pdb:
            stored = pdb.system(system_name)
            known = [s.name for s in pdb.systems()]
    if backend is None:
        if stored is None:
            raise UsageError(f"system {system_name!r} is not in {path} (known: {', '.join(known) or 'none'}); "
                             f"name its library with --backend")
        backend = stored.backend
    options = gen_options_for(backend, dtypes, layouts, maths, not no_fusion, strict=True)
    assert options is not None  # strict: a value the backend lacks was an error
    per_model = input_shapes_per_model(input_shape, models)
    values = input_values_per_model(input_value, models)
    data = load_input_data(input_data) if input_data else {}
    loaded = [load_model(p, batch_size=batch_size, input_shapes=per_model[p], input_values=values[p],
                         input_data=data) for p in models]
    shapes = parse_input_shapes(input_shape)  # as given: the generate command below takes them back
    manifest = build_manifest(loaded, unique_layers(loaded))
    wanted = expand_variants(manifest, get_backend(backend), options)
    if stored is None:
        absent = list(wanted)  # nothing measured on this system yet
    else:
        with PerfDB(path, readonly=True) as pdb:
            system = pdb.system(system_name, backend)
            absent = list(wanted) if system is None else pdb.missing(system, wanted)
    if not absent:
        console.print(f"all {len(wanted)} benchmarks of {len(models)} model(s) are in {path}", highlight=False)
        return
    for v in absent:
        err_console.print(f"missing: {v.name}", highlight=False, soft_wrap=True)
    flags = [*(f"--dtype={d}" for d in dtypes), *(f"--layout={x}" for x in layouts),
             *(f"--math={m}" for m in maths), *(["--no-fusion"] if no_fusion else [])]
    cmd = missing_command(models, system_name, backend, bench_dir=bench_dir, batch_size=batch_size,
                          db=db_path, input_shapes=sorted(shapes.items()),
                          input_values=[parse_input_value(v) for v in input_value], input_data=input_data,
                          generate_flags=flags)
    err_console.print(f"{len(absent)} of {len(wanted)} benchmarks missing on {system_name}; to measure them:\n"
                      f"  {cmd}", highlight=False, soft_wrap=True)
    if not generate_missing:
        sys.exit(1)
    summary = measure_missing(loaded, bench_dir, system_name, backend, path, options, cmd)
    console.print(f"stored {summary.stored} results ({summary.ok} ok)", highlight=False)


# --- campaign ----------------------------------------------------------------------------

@main.group()
def campaign() -> None:
    """Benchmark models on many systems through Slurm, into one database.

    \b
    One job per system (a Slurm partition or constraint), submitted with submitit; each job
    generates, builds and runs the benchmarks on its node into its own shard, and the shards
    merge into the campaign's database as jobs finish. The campaign folder must be on a
    filesystem the nodes share. Submitting again submits only what is missing.
    """


def _campaign_module():
    try:
        from . import campaign as campaign_mod
    except ImportError as exc:
        from .errors import UsageError

        raise UsageError(f"`benanza campaign` needs submitit: pip install 'benanza[campaign]' ({exc})") from None
    return campaign_mod


def campaign_dir_option(f):
    return click.option("--dir", "root", type=click.Path(file_okay=False), required=True,
                        help="Campaign folder, on a filesystem the Slurm nodes share.")(f)


def wait_options(f):
    f = click.option("--poll", type=FiniteRange(min=0.1), default=10.0, show_default=True,
                     help="Seconds between looks at the queue while waiting.")(f)
    f = click.option("--wait/--no-wait", default=True, show_default=True,
                     help="Wait for the jobs, merging each system's results as its job ends.")(f)
    return f


@campaign.command("submit")
@click.argument("models", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@campaign_dir_option
@click.option("--system", "systems", multiple=True, required=True, metavar="NAME:KEY=VALUE,...",
              help="A system and how Slurm finds it, e.g. a100:partition=gpu-a100,gres=gpu:1 or "
                   "v100:constraint=v100 (repeatable). Keys: backend (auto, onednn, cudnn), threads, "
                   "and any submitit Slurm parameter.")
@click.option("--slurm", "slurm_params", multiple=True, metavar="KEY=VALUE",
              help="A submitit Slurm parameter for every system's job, e.g. time=600 (minutes), "
                   "account=perf, cpus_per_task=16, exclusive=true (repeatable).")
@db_option
@click.option("--batch-size", "-b", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--dtype", "dtypes", multiple=True, metavar="DT", help="Data types (default: the backend's).")
@click.option("--layout", "layouts", multiple=True, metavar="L", help="Layouts (nchw, nhwc, any).")
@click.option("--no-fusion", is_flag=True, help="Do not generate fused-layer variants.")
@click.option("--min-time", type=FiniteRange(min=0.0, min_open=True), default=0.2, show_default=True,
              help="Seconds per repetition (Google Benchmark min time).")
@click.option("--repetitions", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--timeout", type=FiniteRange(min=0.0, min_open=True), default=300.0, show_default=True,
              help="Seconds one benchmark may take before it is killed and stored as failed.")
@wait_options
def campaign_submit(models: tuple[str, ...], root: str, systems: tuple[str, ...], slurm_params: tuple[str, ...],
                    db_path: str | None, batch_size: int, dtypes: tuple[str, ...], layouts: tuple[str, ...],
                    no_fusion: bool, min_time: float, repetitions: int, timeout: float, wait: bool,
                    poll: float) -> None:
    """Plan and submit the jobs that MODELS still need on each system.

    A system whose variants are all in the database gets no job; one whose job is still in
    the queue gets no second one. Run it again (or `campaign resume`) after a failure: only
    what is missing is submitted, and a job continues where the previous one stopped.
    """
    from .generator import GenOptions
    from .perfdb import resolve_db_path

    mod = _campaign_module()
    slurm = dict(mod.DEFAULT_SLURM) | dict(mod.parse_slurm_params(slurm_params))
    spec = mod.CampaignSpec(
        models=tuple(str(Path(m).resolve()) for m in models),
        systems=tuple(mod.SystemSpec.parse(s) for s in systems),
        db=str(resolve_db_path(db_path).resolve()), batch_size=batch_size,
        gen=GenOptions(dtypes=dtypes, layouts=layouts, fusion=not no_fusion),
        min_time=min_time, repetitions=repetitions, timeout=timeout, slurm=tuple(slurm.items()))
    _campaign_run(mod, mod.Campaign.create(root, spec), wait, poll)


@campaign.command("resume")
@campaign_dir_option
@wait_options
def campaign_resume(root: str, wait: bool, poll: float) -> None:
    """Submit what the campaign in --dir still lacks, with the spec it was submitted with."""
    mod = _campaign_module()
    _campaign_run(mod, mod.Campaign.open(root), wait, poll)


@campaign.command("status")
@campaign_dir_option
def campaign_status(root: str) -> None:
    """Merge the results of jobs that ended, and show each system's job and progress. Submits nothing."""
    mod = _campaign_module()
    camp = mod.Campaign.open(root)
    reports = mod.collect(camp)
    _print_job_reports(reports)
    _print_campaign_progress(mod.progress(camp), camp)


def _campaign_run(mod, camp, wait: bool, poll: float) -> None:
    def show(progress, reports) -> None:
        _print_job_reports(reports)
        if wait:
            line = "  ".join(f"{p.system}: {p.state.lower()} {p.phase} {p.done}/{p.total}".rstrip()
                             for p in progress)
            err_console.print(line, highlight=False, soft_wrap=True)

    outcome = mod.run(camp, wait=wait, poll=poll, on_poll=show)
    for p in outcome.plans:
        if p.state is mod.PlanState.COMPLETE:
            console.print(f"{p.system}: complete ({p.total} variants in {camp.spec.db})", highlight=False)
    for p in outcome.submitted:
        what = f"{p.missing} of {p.total} variants missing" if p.total is not None else "not measured yet"
        console.print(f"{p.system}: submitted Slurm job {p.job_id} ({what})", highlight=False)
    _print_campaign_progress(mod.progress(camp), camp)
    if any(r.outcome == "failed" for r in outcome.reports):
        sys.exit(1)


def _print_job_reports(reports) -> None:
    from rich.text import Text

    for r in reports:
        if r.outcome == "completed":
            s = r.summary
            console.print(f"{r.system}: job {r.job_id} completed on {s.device} ({s.backend}): {s.ok} ok, "
                          f"{s.unsupported} unsupported, {s.failed} failed, {s.already} already measured; "
                          f"{r.added_results} results merged", highlight=False)
        else:
            err_console.print(Text.assemble((f"{r.system}: job {r.job_id} failed", "bold red"),
                                            f" ({r.state or 'unknown state'}): {r.message}; {r.added_results} "
                                            f"partial results merged; log: {r.log_path}"),
                              highlight=False, soft_wrap=True)
            if r.log_tail:
                err_console.print(r.log_tail, highlight=False, soft_wrap=True, markup=False)


def _print_campaign_progress(progress, camp) -> None:
    from rich.table import Table

    table = Table("system", "job", "state", "phase", "done", "ok", "unsup", "failed",
                  title=f"campaign {camp.folder.root} → {camp.spec.db}")
    for p in progress:
        table.add_row(p.system, p.job_id, p.state.lower(), p.phase, f"{p.done}/{p.total}" if p.total else "",
                      str(p.ok), str(p.unsupported), str(p.failed))
    console.print(table)


# --- profile -----------------------------------------------------------------------------

class _ProfileCommand(click.Command):
    """``benanza profile [OPTIONS] -- CMD ARGS…``: what follows ``--`` is the user's command,
    kept whole (its own options included) instead of being parsed as Benanza's."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta["benanza.command"] = tuple(args[cut + 1:])
            args = args[:cut]
        return super().parse_args(ctx, args)


@main.command(cls=_ProfileCommand)
@click.argument("model", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--framework", type=click.Choice(["onnxruntime", "torch"]), default="onnxruntime",
              show_default=True,
              help="Framework to run the model in (torch: Benanza's eager executor of the ONNX graph).")
@click.option("--batch-size", "-b", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--input-shape", "input_shape", multiple=True, metavar="NAME=D1xD2x..",
              help="Concrete shape of an input whose non-batch dims are symbolic (repeatable), as for "
                   "generate and analyze.")
@value_options
@click.option("--warmup", type=click.IntRange(min=0), default=5, show_default=True,
              help="Untimed runs first; with --command: the first N blocks of each measure name are dropped.")
@click.option("--iterations", type=click.IntRange(min=1), default=50, show_default=True, help="Timed runs.")
@click.option("--trace-iterations", type=click.IntRange(min=1), default=10, show_default=True,
              help="Runs recorded by the framework's profiler (a separate session, so tracing never "
                   "inflates the latency numbers).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Bundle folder [default: profiles/<model>-<framework>-b<batch>, profiles/command-<name>].")
@click.option("--nsys", is_flag=True, help="Also record an Nsight Systems report (needs `nsys` on PATH).")
@click.option("--command", "command_line", metavar="'CMD ARGS…'", default=None,
              help="Profile your own application instead of MODEL (split like a shell line; or give it "
                   "after `--`). Its `benanza.measure(NAME)` blocks give the latency.")
@click.option("--name", "measure_name", metavar="NAME", default=None,
              help="With --command: the measure name that is the model's latency, when it measures several.")
@click.option("--model", "command_model", type=click.Path(exists=True, dir_okay=False), default=None,
              help="With --command: the ONNX file of the network the command runs; the analyzer then "
                   "checks a bundle is of the model it analyses.")
@click.option("--timeout", type=FiniteRange(min=0, min_open=True), default=None,
              help="With --command: seconds each of its two runs may take before it is killed [default: none].")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="The framework's intra-op threads (onnxruntime: intra_op_num_threads; torch: set_num_threads; "
                   "--command: OMP_NUM_THREADS, MKL_NUM_THREADS and $BENANZA_THREADS, which "
                   "benanza.ort_session_options() reads), recorded in the bundle [default: the framework's].")
def profile(model: str | None, framework: str, batch_size: int, input_shape: tuple[str, ...],
            input_value: tuple[str, ...], input_data: str | None, warmup: int,
            iterations: int, trace_iterations: int, device: str, out_dir: str | None, nsys: bool,
            command_line: str | None, measure_name: str | None, command_model: str | None,
            timeout: float | None, threads: int | None) -> None:
    """Run MODEL in a framework, or your own command, and write its execution profile bundle.

    The bundle holds latency statistics (trimmed mean, p50, p90), the framework's per-op
    trace, the cuDNN/cuBLAS/oneDNN logs of the run and, with --nsys, an Nsight Systems
    report. Pass the bundle folder to `benanza analyze --profile`.

    `benanza profile --command 'python serve.py' --model m.onnx` (or `benanza profile -- python
    serve.py`) runs the command twice: once with the library loggers off, timing its
    `benanza.measure` blocks, and once with them on, logging its library calls.
    """
    ctx = click.get_current_context()
    after_dashes = ctx.meta.get("benanza.command")
    if command_line is not None or after_dashes is not None:
        _profile_command(ctx, model, command_line, after_dashes, warmup, device, out_dir, nsys, measure_name,
                         command_model, batch_size, timeout, threads)
        return
    for opt, value in (("--name", measure_name), ("--model", command_model), ("--timeout", timeout)):
        if value is not None:
            raise click.UsageError(f"{opt} applies to --command only")
    if model is None:
        raise click.UsageError("give MODEL, or --command 'CMD' (or `-- CMD…`) to profile your own application")
    from .model_inputs import input_values_per_model, parse_input_shapes
    from .profiler import ProfileSpec, profile_model

    out = out_dir or str(Path("profiles") / f"{Path(model).stem}-{framework}-b{batch_size}")
    spec = ProfileSpec(model=str(Path(model).resolve()), framework=framework, out_dir=out, batch_size=batch_size,
                       warmup=warmup, iterations=iterations, trace_iterations=trace_iterations, device=device,
                       input_shapes=tuple(sorted(parse_input_shapes(input_shape).items())),
                       input_values=tuple(sorted(input_values_per_model(input_value, [model])[model].items())),
                       input_data=input_data, threads=threads)
    bundle = profile_model(spec, nsys=nsys)
    index = json.loads((bundle / "profile.json").read_text())
    lat = index["latency_ms"]
    used = index["threads"]
    console.print(f"{Path(model).stem} on {framework} ({device}, batch {batch_size}, "
                  f"{used or '?'} thread{'' if used == 1 else 's'}): trimmed mean "
                  f"{lat['trimmed_mean']:.4g} ms, p50 {lat['p50']:.4g} ms, p90 {lat['p90']:.4g} ms",
                  highlight=False)
    _print_bundle(bundle, index)


def _print_bundle(bundle: Path, index: dict) -> None:
    for note in index["notes"]:
        console.print(f"note: {note}", highlight=False, soft_wrap=True)
    console.print(f"bundle: {bundle}", highlight=False)


def _profile_command(ctx: click.Context, model: str | None, command_line: str | None,
                     after_dashes: tuple[str, ...] | None, warmup: int, device: str, out_dir: str | None, nsys: bool,
                     measure_name: str | None, command_model: str | None, batch_size: int,
                     timeout: float | None, threads: int | None) -> None:
    import shlex

    from .profiler import CommandSpec, profile_command

    if command_line is not None and after_dashes is not None:
        raise click.UsageError("give the command either as --command 'CMD' or after `--`, not both")
    if model is not None:
        raise click.UsageError(f"{model}: with --command, name the ONNX file with --model")
    for opt in ("framework", "iterations", "trace_iterations", "input_shape", "input_value", "input_data"):
        if ctx.get_parameter_source(opt) != click.core.ParameterSource.DEFAULT:
            raise click.UsageError(f"--{opt.replace('_', '-')} does not apply to --command: the command decides "
                                   f"what runs and how often (its benanza.measure blocks are the iterations)")
    try:
        command = tuple(shlex.split(command_line)) if command_line is not None else after_dashes or ()
    except ValueError as exc:
        raise click.UsageError(f"--command: {exc}") from None
    if not command:
        raise click.UsageError("--command: no command given")
    explicit_batch = ctx.get_parameter_source("batch_size") != click.core.ParameterSource.DEFAULT
    out = out_dir or str(Path("profiles") / f"command-{measure_name or Path(command[0]).name}")
    spec = CommandSpec(command=command, out_dir=out, name=measure_name, warmup=warmup, model=command_model,
                       batch_size=batch_size if explicit_batch else None, device=device, timeout=timeout,
                       threads=threads)
    bundle = profile_command(spec, nsys=nsys)
    index = json.loads((bundle / "profile.json").read_text())
    for name, m in sorted(index["measures"].items()):
        lat = m["latency_ms"]
        mark = " (the model's latency)" if name == index["measure_name"] else ""
        console.print(f"{name}{mark}: {len(lat['samples'])} blocks after {m['warmup_dropped']} warmup, trimmed mean "
                      f"{lat['trimmed_mean']:.4g} ms, p50 {lat['p50']:.4g} ms, p90 {lat['p90']:.4g} ms",
                      highlight=False)
    _print_bundle(bundle, index)


# --- analyze -----------------------------------------------------------------------------

@main.command()
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--system", "systems", multiple=True, required=True, metavar="NAME",
              help="System in the performance database (repeatable: one analysis per system).")
@click.option("--profile", "profiles", multiple=True, type=click.Path(exists=True), metavar="BUNDLE_OR_FILE",
              help="`benanza profile` bundle, or a profile/log file (ORT or PyTorch trace, cuDNN, cuBLAS, "
                   "oneDNN log, Nsight Systems report); repeatable, merged.")
@click.option("--db", "db_path", type=click.Path(dir_okay=False), default=None,
              help="Performance database [default: $BENANZA_DB, else perfdb/benanza.db].")
@click.option("--dtype", default="f32", show_default=True, help="Data type of the bound.")
@click.option("--backend", type=click.Choice(["onednn", "cudnn", "onnxruntime", "torch"]), default=None,
              help="Library whose results the bound uses [default: that of the system's newest stack].")
@click.option("--stack", metavar="ID", default=None,
              help="Stack id (or prefix, see `benanza db info`) [default: the backend's newest stack].")
@click.option("--math", type=click.Choice(["exact", "tf32"]), default="exact", show_default=True,
              help="exact: f32 layers use f32 FMA math only; tf32: f32 layers may use TF32 Tensor Core math.")
@click.option("--batch-size", "-b", "batch_sizes", multiple=True, type=click.IntRange(min=1),
              help="Batch size (repeatable: a sweep) [default: 1].")
@click.option("--input-shape", "input_shape", multiple=True, metavar="NAME=D1xD2x..",
              help="Concrete shape of an input whose non-batch dims are symbolic (repeatable).")
@value_options
@click.option("--measured-ms", type=FiniteRange(min=0, min_open=True), default=None,
              help="Measured model latency, when no profile gives one.")
@click.option("--generate-missing", is_flag=True, help="Generate and run the benchmarks the database lacks.")
@click.option("--json", "as_json", is_flag=True, help="Print the analysis as JSON (docs/analyze-json.md).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None,
              help="Write a self-contained HTML report here.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None,
              help="Write the per-layer table (every layer) as CSV here.")
@click.option("--limit", type=click.IntRange(min=0), default=60, show_default=True,
              help="Layers shown in the terminal table (the slowest first when cut); 0: all.")
@click.option("--depth", type=click.IntRange(min=0), default=2, show_default=True,
              help="Levels of the module tree shown in the terminal (docs/modules.md).")
@click.option("--allow-contended", is_flag=True,
              help="Print the analysis even when it rests on results measured under contention, every figure "
                   "labelled contended (without it: one line saying what to re-measure, exit status 3).")
@click.option("--phase", "phases", multiple=True, metavar="prefill:S|decode:L",
              help="LLM phase (repeatable): S tokens with an empty KV cache, or one token after a cache of "
                   "length L, set on the model's symbolic sequence and KV inputs; bounds, tokens/s and per-layer "
                   "shares per phase (docs/analyze.md, Phases).")
def analyze(model: str, systems: tuple[str, ...], profiles: tuple[str, ...], db_path: str | None, dtype: str,
            backend: str | None, stack: str | None, math: str, batch_sizes: tuple[int, ...],
            input_shape: tuple[str, ...], input_value: tuple[str, ...], input_data: str | None,
            measured_ms: float | None, generate_missing: bool, as_json: bool, report_path: str | None,
            csv_path: str | None, limit: int, depth: int, allow_contended: bool, phases: tuple[str, ...]) -> None:
    """Lower-bound latency of MODEL on a system, the Benanza ratio, and Q1–Q6 advice.

    Sequential and parallel (critical-path) bounds from the best benchmarked variant of each
    layer, all from one backend and one software stack of the system (printed); with a
    profile, the ratio to the measured latency (also against a bound with the framework's own
    fusions), the algorithms the framework used vs the best, its calls vs the expected ones,
    and its time per layer.
    """
    from .analysis.phases import parse_phase
    from .model_inputs import input_values_per_model, parse_input_shapes
    from .parsers import load_profile
    from .parsers.bundle import check_model
    from .perfdb import PerfDB, resolve_db_path
    from .report import document, layers_csv, print_analysis, print_sweep, render_html
    from .report_phases import print_phases
    from .sweep import SweepRequest, phase_plan, run_phases, run_sweep, write_report

    req = SweepRequest(model=model, systems=systems, batch_sizes=batch_sizes or (1,), dtype=dtype,
                       input_shapes=tuple(sorted(parse_input_shapes(input_shape).items())),
                       input_values=tuple(sorted(input_values_per_model(input_value, [model])[model].items())),
                       input_data=input_data, measured_ms=measured_ms, generate_missing=generate_missing,
                       backend=backend, stack=stack, math=math)
    if measured_ms is not None and len(req.systems) * len(req.batch_sizes) > 1:
        raise click.UsageError("--measured-ms applies to one system and one batch size")
    plan = phase_plan(req, [parse_phase(p) for p in phases]) if phases else []
    prof = load_profile(list(profiles))
    if prof is not None:
        check_model(prof, model)  # a profile of another model is the first thing to hear about
    with PerfDB(resolve_db_path(db_path), readonly=True) as pdb:
        analyses = run_phases(req, pdb, plan, prof) if plan else run_sweep(req, pdb, prof)
    refused = [a for a in analyses if a.contended]
    if refused and not allow_contended:
        from .analyzer import contended_subject

        # A bound inflated by other processes reads as a real one: no figure, one line each.
        for a in refused:
            print_error(f"{a.model} on {a.system} (batch {a.batch_size}): no bound printed: {contended_subject(a)} "
                        f"were measured while other processes took the CPU. Re-measure them on an idle machine: "
                        f"{a.remeasure_command} (or pass --allow-contended to print the figures labelled contended)")
        sys.exit(3)
    if not allow_contended:
        from .analyzer import withhold_contended

        for a in analyses:
            withhold_contended(a)
    if report_path:
        path = write_report(report_path, render_html(analyses))
        err_console.print(f"report: {path}", highlight=False)
    if csv_path:
        path = write_report(csv_path, layers_csv(analyses))
        err_console.print(f"layers: {path}", highlight=False)
    if as_json:
        echo_json(document(analyses))
        return
    for a in analyses:
        print_analysis(a, console, max_layers=limit, depth=depth)
    if len(analyses) > 1:
        print_sweep(analyses, console)
    print_phases(analyses, console)
