"""Benchmark generator (paper §III-B): unique layers → variants → a backend's project.

A backend is a small module in ``benanza/backends/`` implementing ``backends.base.Backend``
(docs/backends.md). It expands each layer of the manifest into the variants its library or
framework can run (algorithm × dtype × layout × math × fusion) and renders its project: for
the vendor libraries, data tables (from ``templates/<backend>/``) that the shared runtime
(``runtime_cpp/``) turns into registered Google Benchmarks; for a framework, the subgraphs its
measuring child loads.

Output layout, under the ``--out`` folder::

    layers.json                 the unique-layer manifest (processor output)
    <backend>/CMakeLists.txt    a standalone CMake project (C++ backends)
    <backend>/*.cpp|*.cu        generated tables and registrations
    <backend>/models/*.onnx     the layers' subgraphs (framework backends)
    <backend>/variants.json     every variant generated, by benchmark name

Every file, the two JSON indexes included, lists what it holds in an order of its own content
(``records.variant_order``), so the same models give the same bytes in any order.
"""

from __future__ import annotations

import importlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import BenanzaError
from .escape import c_string, cmake_quoted
from .layers import Model
from .manifest import Manifest
from .ort_fusions import benchmarked_by
from .outputs import make_folder, write_text, write_with
from .records import Variant, variant_order
from .resources import runtime_dir, templates_dir

if TYPE_CHECKING:
    import jinja2

    from .backends.base import Backend

VARIANTS_NAME = "variants.json"

# backend name → module defining ``BACKEND`` (imported lazily: a backend's deps stay optional)
BACKEND_MODULES = {
    "cudnn": "benanza.backends.cudnn",
    "onednn": "benanza.backends.onednn",
    "onnxruntime": "benanza.backends.ort",
    "torch": "benanza.backends.torch_native",
}
# what `generate --backend all` writes: the vendor libraries' benchmarks (a framework's own
# backend is asked for by name)
LIBRARY_BACKENDS = ("cudnn", "onednn")


@dataclass(frozen=True)
class GenOptions:
    """What to expand. Empty tuples mean the backend's defaults."""

    dtypes: tuple[str, ...] = ()
    layouts: tuple[str, ...] = ()
    math: tuple[str, ...] = ()
    fusion: bool = True
    cupti: bool = False  # cuDNN: fixed-iteration CUPTI kernel-metrics mode instead of timing
    cupti_metrics: tuple[str, ...] = ()
    extra: tuple[tuple[str, str], ...] = field(default_factory=tuple)


def get_backend(name: str) -> Backend:
    module = BACKEND_MODULES.get(name)
    if module is None:
        raise BenanzaError(f"unknown backend {name!r}; known: {', '.join(sorted(BACKEND_MODULES))}")
    backend: Backend = importlib.import_module(module).BACKEND
    return backend


def template_env(backend: str) -> jinja2.Environment:
    """Jinja with StrictUndefined: a missing template value is an error, never empty C++."""
    import jinja2  # only generating renders: `analyze` expands variants without loading it

    root = templates_dir()
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(root / backend), str(root / "common")]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["cstr"] = lambda s: c_string(str(s))
    env.filters["cmake"] = lambda s: cmake_quoted(str(s))
    return env


@dataclass
class Generated:
    backend: str
    out_dir: Path
    variants: list[Variant]
    files: list[Path]


def expand_variants(manifest: Manifest, backend: Backend, options: GenOptions) -> list[Variant]:
    """Every variant of the manifest's layers, once each, in ``variant_order``: variants.json
    lists them so, the same for the same models in any order."""
    fusions: dict[str, list[str]] = {}
    for f in manifest.fusions:
        fusions.setdefault(f.layer, []).append(f.pattern)
    out: dict[str, Variant] = {}
    for u in manifest.layers:
        used = tuple(sorted(f for f in fusions.get(u.layer.key, []) if benchmarked_by(f, backend.name))) \
            if options.fusion else ()
        for v in backend.variants(u, used, options):
            if not u.occurrences and u.layer.key in fusions and v.fusion == "none":
                continue  # a pattern's fused form only (build_manifest): no node runs it unfused
            # one benchmark per problem and configuration: an f16 model's conv and the f16
            # variant of an f32 model's identical conv are the same benchmark
            out.setdefault(v.name, v)
    return sorted(out.values(), key=variant_order)


def generate(manifest: Manifest, backend_name: str, out_root: str | Path,
             options: GenOptions = GenOptions(), models: Sequence[Model] = ()) -> Generated:
    """``models``: the processed models the manifest came from (see ``Backend.render``)."""
    backend = get_backend(backend_name)
    out_dir = make_folder(Path(out_root) / backend_name)
    variants = expand_variants(manifest, backend, options)
    files = backend.render(manifest, variants, template_env(backend_name), out_dir, options, models)
    write_variants(out_dir, backend_name, variants, options)
    return Generated(backend_name, out_dir, variants, files)


def write_if_changed(path: Path, text: str) -> Path:
    """Write a generated file only when its content changed: unchanged sources keep their
    mtime, so a rebuild after regeneration recompiles only what differs."""
    if not path.exists() or path.read_text() != text:
        write_text(path, text)
    return path


def copy_runtime(dest: Path, parts: tuple[str, ...]) -> list[Path]:
    """Copy ``runtime_cpp/<part>`` folders into a generated project (unchanged files untouched),
    so the project builds on a machine without a Benanza checkout (e.g. the GPU box)."""
    files = []
    for part in parts:
        src_root = runtime_dir() / part
        for src in sorted(src_root.rglob("*")):
            if src.is_file() and "__pycache__" not in src.parts:
                target = dest / part / src.relative_to(src_root)
                make_folder(target.parent)
                if not target.exists() or target.read_bytes() != src.read_bytes():
                    write_with(target, partial(shutil.copyfile, src))
                files.append(target)
    return files


def write_variants(out_dir: Path, backend: str, variants: list[Variant], options: GenOptions) -> Path:
    path = out_dir / VARIANTS_NAME
    data = {"backend": backend, "options": asdict(options),
            "variants": [v.to_json() for v in variants]}
    return write_text(path, json.dumps(data, indent=1) + "\n")


def read_variants(out_dir: str | Path) -> list[Variant]:
    path = Path(out_dir) / VARIANTS_NAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise BenanzaError(f"{path}: no generated benchmarks here; run `benanza generate` first") from None
    except ValueError as exc:
        raise BenanzaError(f"{path}: unreadable variants file ({exc})") from None
    try:
        return [Variant.from_json(d) for d in data["variants"]]
    except (KeyError, TypeError, BenanzaError) as exc:
        raise BenanzaError(f"{path}: variants of an older or foreign generator ({exc}); run `benanza generate` "
                           f"again") from None
