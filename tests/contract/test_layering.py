"""The import graph: no stage imports a later one (DESIGN.md: data flows one way, processor →
generator → runner → perfdb → analyzer; a stage reads the previous stage's output types, never
its internals). Read from the source with ``ast``, so a lazy import inside a function counts as
much as one at the top; imports only for type annotations (``if TYPE_CHECKING:``) do not."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO

PACKAGE = REPO / "benanza"

# Each module's stage, lowest first; a module may import its own stage and any lower one. The
# first prefix that matches a module's dotted name (``benanza.`` left off) decides.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("errors", "escape", "outputs", "resources", "scopes", "measurement", "children", "toolchain",
              "limits", "heap")),
    # what every stage speaks: op families and their registry, layer and variant records, the
    # fusion patterns (the libraries' and ONNX Runtime's own), the machine's description and its speed, the parsers
    # of logs and traces
    ("vocabulary", ("ops", "layers", "problems", "records", "fusion", "ort_fusions", "system", "machine_speed",
                    "parsers")),
    # torch_exec: ONNX graphs run eagerly in torch, over the processor only (the torch backend
    # measures its calls, the profiler runs whole models with it)
    ("model", ("processor", "control_flow", "shapes_by_execution", "manifest", "torch_exec", "model_inputs",
               "model_stats", "model_cache", "model_values")),
    ("generate", ("generator", "backends")),
    ("run", ("runner", "peaks", "perfdb")),
    ("profile", ("profiler",)),
    ("analysis", ("analysis", "analyzer")),
    ("report", ("report", "report_modules", "report_phases")),
    # the commands over all of them, and the reference-model builders
    ("commands", ("cli", "campaign", "sweep", "check", "zoo", "__init__")),
)


def _stage(module: str) -> int:
    for rank, (_, prefixes) in enumerate(STAGES):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    raise AssertionError(f"benanza.{module} has no stage in STAGES")


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def _imports(path: Path) -> set[str]:
    """The benanza modules a file imports at run time (relative to the package)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for stmt in node.body for n in ast.walk(stmt)}
    here = _module(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
            target = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:  # `from . import x` names a module
                sub = f"{target}.{alias.name}" if target else alias.name
                found.add(sub if (PACKAGE / sub.replace(".", "/")).with_suffix(".py").is_file()
                          or (PACKAGE / sub.replace(".", "/")).is_dir() else target)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benanza"):
            found.add(node.module.removeprefix("benanza").lstrip("."))
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("benanza").lstrip(".") for a in node.names if a.name.startswith("benanza"))
    return {m for m in found if m}


def test_every_module_has_a_stage() -> None:
    for path in PACKAGE.rglob("*.py"):
        _stage(_module(path))


def test_no_stage_imports_a_later_one() -> None:
    upward = sorted(f"{_module(path)} ({STAGES[_stage(_module(path))][0]}) imports {target} "
                    f"({STAGES[_stage(target)][0]})"
                    for path in PACKAGE.rglob("*.py") for target in _imports(path)
                    if _stage(target) > _stage(_module(path)))
    assert not upward, "\n".join(upward)
