"""The ``benanza`` command: thin click subcommands over the library stages."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from .errors import BenanzaError

console = Console()
err_console = Console(stderr=True)


class _Group(click.Group):
    """Converts library errors into one clean line at the boundary, never a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BenanzaError as exc:
            err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
            sys.exit(1)


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
      benanza profile MODEL            run a framework on the model and record what it did
      benanza analyze MODEL            lower bounds, Benanza ratio and optimization advice
      benanza db ...                   inspect, export and merge performance databases
    """
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


# --- shared options ----------------------------------------------------------------------

def batch_options(f):
    f = click.option("--input-shape", "input_shape", multiple=True, metavar="NAME=D1xD2x..",
                     help="Concrete shape of an input whose non-batch dims are symbolic (repeatable).")(f)
    f = click.option("--batch-size", "-b", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Batch size: overrides dim 0 of every graph input.")(f)
    return f


# --- zoo ---------------------------------------------------------------------------------

@main.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="models",
              show_default=True, help="Folder to write <name>.onnx files into.")
@click.option("--only", multiple=True, metavar="NAME", help="Build only these models (repeatable).")
@click.option("--list", "list_only", is_flag=True, help="List the reference models and exit.")
def zoo(out_dir: str, only: tuple[str, ...], list_only: bool) -> None:
    """Build the paper's 30 reference models (Table I) as ONNX files, offline and deterministically.

    The models follow the ONNX Model Zoo versions the paper used, with random weights.
    """
    from rich.progress import Progress

    from . import zoo as zoo_mod

    if list_only:
        table = Table("id", "name", "task", "paper MACs", "paper layers")
        for m in zoo_mod.MODELS:
            table.add_row(str(m.id), m.name, m.task, f"{m.paper_macs / 1e9:.3g}G", str(m.paper_layers))
        console.print(table)
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


# --- generate ----------------------------------------------------------------------------

@main.command()
@click.argument("models", nargs=-1, required=True, type=click.Path())
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="out/bench",
              show_default=True, help="Folder for layers.json and generated benchmark sources.")
@batch_options
@click.option("--backend", type=click.Choice(["all", "cudnn", "onednn", "none"]), default="all",
              show_default=True, help="Which library's benchmarks to generate ('none': manifest only).")
@click.option("--dtype", "dtypes", multiple=True, metavar="DT",
              help="Data types (f32, f16, bf16); default: the backend's (cudnn f32+f16, onednn f32+bf16 "
                   "where the CPU has it).")
@click.option("--layout", "layouts", multiple=True, metavar="L", help="Layouts (nchw, nhwc, any).")
@click.option("--math", "maths", multiple=True, metavar="M",
              help="cuDNN math modes (default, tensor_op, tf32); default: per dtype.")
@click.option("--no-fusion", is_flag=True, help="Do not generate fused-layer variants.")
@click.option("--cupti", is_flag=True, help="cuDNN: CUPTI kernel-metrics mode instead of timing.")
@click.option("--cupti-metric", "cupti_metrics", multiple=True, metavar="NAME",
              help="CUPTI metric to record per kernel in --cupti mode (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON on stdout.")
def generate(models: tuple[str, ...], out_dir: str, batch_size: int, input_shape: tuple[str, ...],
             backend: str, dtypes: tuple[str, ...], layouts: tuple[str, ...], maths: tuple[str, ...],
             no_fusion: bool, cupti: bool, cupti_metrics: tuple[str, ...], as_json: bool) -> None:
    """Process ONNX models into their unique layers and write the benchmark manifest.

    Prints, per model, its layers, unique layers and the share covered by cuDNN/cuBLAS, plus
    the union across models, and writes OUT/layers.json (keys, parameters, shapes, occurrences).
    A file that cannot be processed gets one error line; the others are still processed and
    the exit status is non-zero.
    """
    from .generator import BACKEND_MODULES, GenOptions
    from .generator import generate as generate_backend
    from .manifest import build_manifest, write_manifest
    from .processor import load_model, model_stats, parse_input_shapes, total_stats, unique_layers

    shapes = parse_input_shapes(input_shape)
    loaded, failed = [], 0
    for path in models:
        try:
            loaded.append(load_model(path, batch_size=batch_size, input_shapes=shapes))
        except BenanzaError as exc:
            failed += 1
            err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
    uniques = unique_layers(loaded)
    stats = [model_stats(m) for m in loaded]
    total = total_stats(loaded, uniques)
    generated = []
    if loaded:
        manifest = build_manifest(loaded, uniques)
        write_manifest(manifest, out_dir)
        options = GenOptions(dtypes=dtypes, layouts=layouts, math=maths, fusion=not no_fusion,
                             cupti=cupti, cupti_metrics=cupti_metrics)
        names = [] if backend == "none" else list(BACKEND_MODULES) if backend == "all" else [backend]
        generated = [generate_backend(manifest, name, out_dir, options) for name in names]
    if as_json:
        click.echo(json.dumps({"models": [s.to_json() for s in stats], "total": total.to_json()},
                              indent=1))
    else:
        _print_stats(stats, total)
        if loaded:
            console.print(f"manifest: {Path(out_dir) / 'layers.json'} ({len(uniques)} unique layers)",
                          highlight=False)
        for g in generated:
            console.print(f"{g.backend}: {len(g.variants)} benchmark variants in {g.out_dir}",
                          highlight=False)
    if failed:
        sys.exit(1)


def _print_stats(stats, total) -> None:
    table = Table("model", "layers", "unique", "% unique", "covered", "% covered", "MACs",
                  "not covered (by op)", title="layers per model")
    for s in stats + [total]:
        uncovered = ", ".join(f"{op}×{n}" for op, n in s.not_covered)
        table.add_row(s.model, str(s.layers), str(s.unique_layers), f"{s.unique_pct:.1f}",
                      str(s.covered_layers), f"{s.covered_pct:.1f}", f"{s.macs / 1e9:.3f}G",
                      uncovered, end_section=s is stats[-1])
    console.print(table)
