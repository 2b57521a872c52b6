"""The project's modules import one way: down an ordered list of layers, with no cycle.

Every module of tensat/, rewrites/ (installed as tensat.rewrites), extraction/ (installed as tensat.extraction) and
bench/ is parsed, and the imports between them, those inside functions included, make a graph. LAYERS below is the
order, lowest first; a module may import modules of its own layer or of a layer below, never of one above:

- base: the package version, the error types, atomic file writes, progress reporting, the run options (options), the
  tensor operators (ops) and the graph IR (ir). Everything else builds on these.
- rules: tensat.rewrites, the rule library, parsed once and matched on graphs; it uses only the operators and the IR
  (REWRITES_MAY_IMPORT).
- extraction: tensat.extraction, extraction over any e-graph in the egraph-serialize JSON format; it knows nothing of
  tensors and imports no other part of the project.
- onnx: models in and out of ONNX (tensat.onnx_io), running them in onnxruntime (session, verify, latency), the
  built-in benchmark graphs (models).
- costs: the analytic cost model (cost) and the measured one with its cache (measure, costcache, cost_report).
- search: the e-graph exploration (egraph) and the TASO-style sequential search (sequential), each over the rules
  and a cost model.
- pipeline: `tensat.optimize` (api), the comparison of the two searches (compare), and the package's own
  `__init__`, which exposes the pipeline's names lazily.
- cli: the `tensat` command and its subcommands (cli, cli_args, compare_cli, measure_cli, __main__).
- bench: the benchmarks, not installed with tensat; nothing of tensat imports them.

A module belongs to the layer of its own name or of its nearest package listed (tensat.measure.cache would be in
`costs` with tensat.measure); the root package `tensat` names only tensat/__init__.py. A new module goes into the
list where its imports put it.
"""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Folder of the repository -> the package it installs as (pyproject.toml's package-dir); bench/ is not installed.
FOLDERS = {"tensat": "tensat", "rewrites": "tensat.rewrites", "extraction": "tensat.extraction", "bench": "bench"}

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        (
            "tensat._version",
            "tensat.errors",
            "tensat.files",
            "tensat.progress",
            "tensat.options",
            "tensat.ops",
            "tensat.ir",
        ),
    ),
    ("rules", ("tensat.rewrites",)),
    ("extraction", ("tensat.extraction",)),
    ("onnx", ("tensat.onnx_io", "tensat.onnx", "tensat.session", "tensat.verify", "tensat.latency", "tensat.models")),
    ("costs", ("tensat.cost", "tensat.costcache", "tensat.measure", "tensat.cost_report")),
    ("search", ("tensat.egraph", "tensat.sequential")),
    ("pipeline", ("tensat", "tensat.api", "tensat.compare")),
    (
        "cli",
        (
            "tensat.cli_args",
            "tensat.cli",
            "tensat.compare_cli",
            "tensat.generate_cli",
            "tensat.measure_cli",
            "tensat.__main__",
        ),
    ),
    ("bench", ("bench",)),
]

# What the rule library may use of the rest of tensat.
REWRITES_MAY_IMPORT = {"tensat.ops", "tensat.ir", "tensat.errors", "tensat.options"}  # options: the rule sets' names


@dataclass(frozen=True)
class Import:
    """One import of a project module by another."""

    source: str
    target: str
    path: Path
    line: int
    in_function: bool
    commented: bool


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [FOLDERS[rel.parts[0]], *rel.parts[1:]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _files() -> dict[str, Path]:
    return {_module_name(p): p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))}


MODULES = _files()


def _comment_lines(source: str) -> set[int]:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {tok.start[0] for tok in tokens if tok.type == tokenize.COMMENT}


def _targets(node: ast.Import | ast.ImportFrom, module: str, path: Path) -> list[str]:
    """The project modules an import statement loads (the package for a name defined in its __init__)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
        return [n for n in names if n.split(".")[0] in FOLDERS]
    if node.level:
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{node.module}" if node.module else package
    else:
        base = node.module or ""
    if base.split(".")[0] not in FOLDERS:
        return []
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def _imports(module: str, path: Path) -> list[Import]:
    source = path.read_text(encoding="utf-8")
    comments = _comment_lines(source)
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                lines = range(child.lineno, (child.end_lineno or child.lineno) + 1)
                commented = any(n in comments for n in lines)
                for target in _targets(child, module, path):
                    found.append(Import(module, target, path, child.lineno, in_function, commented))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source, str(path)), False)
    return found


IMPORTS = [imp for module, path in MODULES.items() for imp in _imports(module, path)]


def _where(imp: Import) -> str:
    return f"{imp.path.relative_to(ROOT)}:{imp.line}: {imp.source} imports {imp.target}"


def _layer_index() -> dict[str, int]:
    return {name: i for i, (_, names) in enumerate(LAYERS) for name in names}


def layer_of(module: str) -> int | None:
    """The index in LAYERS of `module`: that of its own name or its nearest listed package (not the root `tensat`)."""
    index = _layer_index()
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in index and (n == len(parts) or name != "tensat"):
            return index[name]
    return None


def test_every_import_of_the_project_names_an_existing_module():
    missing = [_where(imp) for imp in IMPORTS if imp.target not in MODULES]
    assert not missing, (
        "imports of modules that do not exist (rewrites and extraction are tensat.rewrites and "
        "tensat.extraction):\n" + "\n".join(missing)
    )


def test_no_file_imports_the_bare_folder_names():
    """rewrites/ and extraction/ install as tensat.rewrites and tensat.extraction; tests included."""
    bad = []
    for path in sorted([*ROOT.joinpath("tests").rglob("*.py"), *MODULES.values()]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            bad += [
                f"{path.relative_to(ROOT)}:{node.lineno}: {n}"
                for n in names
                if n.split(".")[0] in ("rewrites", "extraction")
            ]
    assert not bad, "import tensat.rewrites / tensat.extraction instead:\n" + "\n".join(bad)


def test_no_import_cycle():
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for imp in IMPORTS:
        if imp.target in graph and imp.target != imp.source:
            graph[imp.source].add(imp.target)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_extraction_imports_nothing_else_of_the_project():
    bad = [
        _where(imp)
        for imp in IMPORTS
        if imp.source.startswith("tensat.extraction") and not imp.target.startswith("tensat.extraction")
    ]
    assert not bad, "\n".join(bad)


def test_rewrites_imports_only_the_base_modules():
    bad = [
        _where(imp)
        for imp in IMPORTS
        if imp.source.startswith("tensat.rewrites")
        and not imp.target.startswith("tensat.rewrites")
        and imp.target not in REWRITES_MAY_IMPORT
    ]
    assert not bad, "\n".join(bad)


def test_nothing_installed_imports_bench():
    bad = [_where(imp) for imp in IMPORTS if not imp.source.startswith("bench") and imp.target.split(".")[0] == "bench"]
    assert not bad, "\n".join(bad)


def test_every_module_has_a_layer():
    assert not [m for m in MODULES if layer_of(m) is None], "add these modules to LAYERS"


def test_no_import_goes_up_a_layer():
    bad = []
    for imp in IMPORTS:
        src, dst = layer_of(imp.source), layer_of(imp.target)
        if src is not None and dst is not None and dst > src:
            bad.append(f"{_where(imp)} ({LAYERS[src][0]} -> {LAYERS[dst][0]})")
    assert not bad, "imports up the layers:\n" + "\n".join(bad)


def test_an_import_inside_a_function_says_why():
    bad = [_where(imp) for imp in IMPORTS if imp.in_function and not imp.commented]
    assert not bad, (
        "move these imports to the top of the module, or say on the same line why they are inside a "
        "function:\n" + "\n".join(bad)
    )


def test_importing_a_part_does_not_load_the_pipeline():
    code = (
        "import sys, tensat.extraction, tensat.rewrites; "
        "print(sorted(m for m in ('tensat.api', 'tensat.egraph', 'bench') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_the_package_exposes_the_pipeline_lazily():
    import tensat

    assert callable(tensat.optimize) and callable(tensat.optimize_with_details)
    assert tensat.Options.__module__ == "tensat.options" and tensat.Graph.__module__ == "tensat.ir"
    assert set(tensat.__all__) <= set(dir(tensat))
    with pytest.raises(AttributeError):
        _ = tensat.no_such_name


def test_pyproject_installs_one_package_tensat():
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert all(p == "tensat" or p.startswith("tensat.") for p in config["packages"])
    installed = {folder: package for folder, package in FOLDERS.items() if folder != "bench"}
    subpackages = {  # every package inside the installed folders, so that a wheel holds all of them
        ".".join((installed[top.parts[0]], *top.parts[1:]))
        for folder in installed
        for top in (p.parent.relative_to(ROOT) for p in (ROOT / folder).rglob("__init__.py"))
    }
    assert set(config["packages"]) == subpackages
    assert config["package-dir"] == {p: f for f, p in installed.items() if f != p}
