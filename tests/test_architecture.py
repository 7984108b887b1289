"""The import table of docs/architecture.md, enforced: every module's imports against the table, and no cycles.

Every ``import`` and ``from ... import`` of every module under cake_core/, warehouse/, tasks/, flows/ and
cake_cli/ is read with ``ast`` (module-level, function-level and inside ``if TYPE_CHECKING:`` alike) and
checked against :data:`TABLE`: a module may import the standard library, its own folder, the folders and
third-party packages of its row, and (inside cake_core) the shared leaves ``cake_core.errors`` and
``cake_core.outcome``. Third-party packages marked lazy (CuPy, the CUDA driver bindings, torch, flash-kmeans,
openai) may be imported inside functions (or for type checking) only, so that the module imports on a machine
without them. bench/ and tests/ are scripts over the packages, outside the table.

The no-cycle test follows every import too, not only those that run when a module loads: a function-level or
type-checking import still says that one module needs the other, and two modules that need each other are one
concern split in two. Any cycle among first-party modules fails, reported as a path ``a -> b -> c -> a``.
``from a.b import c`` reads ``c`` off the package ``a.b``, whose init (which may re-export ``c``'s importers)
must have run: it is an edge to ``a.b`` as well as to ``a.b.c``. Importing ``a.b.c`` by its own path runs
``a/__init__`` and ``a/b/__init__`` too; those implied imports are not edges here, so a package's modules
import each other by their own paths.
"""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cake_core", "warehouse", "tasks", "flows", "cake_cli")
DOC = ROOT / "docs" / "architecture.md"

# folder -> what its modules may import: other folders of this table, third-party packages by import name,
# "stdlib". The same table, rendered by render_table(), stands in docs/architecture.md.
TABLE: dict[str, tuple[str, ...]] = {
    "cake_core/targets": ("stdlib",),
    "cake_core/ir": ("stdlib", "numpy", "cake_core/targets"),
    "cake_core/lower": ("stdlib", "cake_core/ir", "cake_core/targets"),
    "cake_core/model": ("stdlib", "numpy", "lightgbm", "cake_core/ir", "cake_core/lower", "cake_core/targets"),
    "cake_core/problems": ("stdlib", "numpy", "torch", "flash_kmeans", "fla", "cake_core/ir"),
    "cake_core/agents": ("stdlib", "numpy", "openai", "cake_core/ir", "cake_core/model", "cake_core/problems",
                         "cake_core/targets"),
    "cake_core/runtime": ("stdlib", "numpy", "cupy", "cuda", "torch", "flash_kmeans", "cake_core/ir",
                          "cake_core/lower", "cake_core/problems", "cake_core/targets"),
    "cake_core/harness": ("stdlib", "numpy", "cake_core/targets", "cake_core/ir", "cake_core/lower", "cake_core/model",
                          "cake_core/agents",
                          "cake_core/problems", "cake_core/runtime"),
    "cake_core/pipeline": ("stdlib", "numpy", "cake_core/targets", "cake_core/ir", "cake_core/lower", "cake_core/model",
                           "cake_core/problems", "cake_core/agents", "cake_core/runtime", "cake_core/harness"),
    "cake_core/export": ("stdlib", "cake_core/targets", "cake_core/ir", "cake_core/lower", "cake_core/problems",
                         "cake_core/runtime"),
    "warehouse": ("stdlib", "duckdb", "pyarrow", "great_expectations"),
    "tasks": ("stdlib", "numpy", "cupy", "prefect", "pydantic", "ray", "tenacity", "cake_core", "warehouse"),
    "flows": ("stdlib", "prefect", "tasks"),
    "cake_cli": ("everything",),
}
LAZY = {"cupy", "cuda", "torch", "flash_kmeans", "fla", "openai"}      # inside functions only
LEAVES = ("cake_core/errors", "cake_core/outcome")              # any cake_core folder may import them
FIRST_PARTY = tuple(PACKAGES)


@dataclass(frozen=True)
class Import:
    module: str       # the importing module, dotted
    target: str       # the module imported (the longest dotted prefix that is one of ours, or the third-party name)
    line: int
    lazy: bool        # inside a function or an `if TYPE_CHECKING:` block: not run when the module loads


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


MODULES = _modules()


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str, path: Path, modules: dict[str, Path] | None = None) -> list[Import]:
    """Every import of ``module`` (read from ``path``), its target resolved against ``modules``."""
    modules = MODULES if modules is None else modules
    tree = ast.parse(path.read_text(), str(path))
    out: list[Import] = []

    def resolve(name: str) -> str:
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in modules:
                return ".".join(parts[:i])
        return name

    def visit(nodes: list[ast.stmt], lazy: bool) -> None:
        for n in nodes:
            if isinstance(n, ast.Import):
                out.extend(Import(module, resolve(a.name), n.lineno, lazy) for a in n.names)
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    pkg = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                    base = ".".join(pkg[:len(pkg) - n.level + 1] + ([n.module] if n.module else []))
                # `from pkg import submodule` imports the submodule and reads it off pkg, whose init
                # (re-exporting its submodules, perhaps this very importer) must have run: an edge to each
                for a in n.names:
                    out.append(Import(module, resolve(f"{base}.{a.name}" if f"{base}.{a.name}" in modules
                                                      else base), n.lineno, lazy))
                if base in modules and base != module and any(f"{base}.{a.name}" in modules for a in n.names):
                    out.append(Import(module, base, n.lineno, lazy))
            elif isinstance(n, ast.If) and _type_checking(n.test):
                visit(n.body, True)         # never runs, so a lazy package may be named there
                visit(n.orelse, lazy)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(n.body, True)
            elif isinstance(n, ast.ClassDef):
                visit(n.body, lazy)
            else:
                for field in ("body", "orelse", "finalbody"):
                    visit(getattr(n, field, None) or [], lazy)
                for h in getattr(n, "handlers", None) or []:
                    visit(h.body, lazy)
    visit(tree.body, False)
    return out


IMPORTS = [i for m, p in MODULES.items() for i in _imports(m, p)]


def folder_of(module: str) -> str:
    """The row of TABLE (or the shared leaf) a module of ours belongs to."""
    path = module.replace(".", "/")
    for leaf in LEAVES:
        if path == leaf:
            return leaf
    keys = sorted(TABLE, key=len, reverse=True)
    return next((k for k in keys if path == k or path.startswith(k + "/")), path.split("/")[0])


def allowed(imp: Import) -> str | None:
    """Why ``imp`` breaks the table (None when it does not)."""
    src = folder_of(imp.module)
    row = TABLE.get(src)
    top = imp.target.split(".")[0]
    if src in LEAVES or src == "cake_core":
        row = ("stdlib",)
    if row is None:
        return f"{imp.module} is in no row of the table"
    if top in sys.stdlib_module_names or top == "__future__":
        return None
    if top in FIRST_PARTY:
        dst = folder_of(imp.target)
        if dst == src or "everything" in row or top in row:
            return None
        if dst in LEAVES and src.startswith("cake_core"):
            return None
        if dst in row:
            return None
        return f"{imp.module} imports {imp.target} ({dst}); {src} may import {', '.join(row)}"
    if "everything" in row or top in row:
        if top in LAZY and not imp.lazy:
            return f"{imp.module} imports {top} at module level; it is imported inside functions only"
        return None
    return f"{imp.module} imports the third-party {top}; {src} may import {', '.join(row)}"


@pytest.mark.parametrize("folder", [k for k in TABLE if k != "flows"] + ["leaves"])
def test_imports_follow_the_table(folder):
    rows = [i for i in IMPORTS if (folder_of(i.module) in LEAVES if folder == "leaves" else folder_of(i.module) == folder)]
    assert rows, f"no module of {folder} was read"
    bad = [f"{MODULES[i.module].relative_to(ROOT)}:{i.line}: {why}" for i in rows if (why := allowed(i))]
    assert not bad, "imports that break the table of docs/architecture.md:\n" + "\n".join(bad)


def test_flows_import_only_prefect_and_tasks():
    bad = [f"{MODULES[i.module].relative_to(ROOT)}:{i.line}: {why}" for i in IMPORTS
           if folder_of(i.module) == "flows" and (why := allowed(i))]
    assert not bad, "flows import more than Prefect, tasks and the standard library:\n" + "\n".join(bad)


def _cycle_through(v: str, comp: set[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest import path from ``v`` back to ``v`` inside the strongly connected ``comp``."""
    came: dict[str, str] = {}
    frontier = [v]
    while frontier:
        nxt = []
        for u in frontier:
            for w in sorted(edges.get(u, ())):
                if w == v:
                    path = [u]
                    while path[-1] != v:
                        path.append(came[path[-1]])
                    return [v, *reversed(path[:-1]), v]
                if w in comp and w not in came:
                    came[w] = u
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{v} is on no cycle of {sorted(comp)}")


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One import cycle per strongly connected component of more than one module (Tarjan), each a path
    ``[a, b, c, a]`` from the component's first module back to itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(_cycle_through(min(comp), set(comp), edges))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def module_edges(imports: list[Import] | None = None,
                 modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the first-party modules it imports anywhere (module level, in functions, for type checking)."""
    imports = IMPORTS if imports is None else imports
    modules = MODULES if modules is None else modules
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for i in imports:
        if i.target in modules and i.target != i.module:
            edges[i.module].add(i.target)
    return edges


def test_no_import_cycles():
    cycles = _cycles(module_edges())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_planted_cycle():
    edges = module_edges()
    edges["cake_core.ir.expr"] = edges["cake_core.ir.expr"] | {"cake_core.ir.ops"}    # ops -> ... -> expr
    cycles = _cycles(edges)
    assert any("cake_core.ir.expr" in c and "cake_core.ir.ops" in c for c in cycles)
    assert all(c[0] == c[-1] and all(b in edges[a] for a, b in zip(c, c[1:])) for c in cycles)


def test_a_cycle_through_function_level_and_type_checking_imports_is_found(tmp_path):
    (tmp_path / "probe").mkdir()
    files = {
        "probe.a": "def f():\n    from probe.b import g\n    return g\n",
        "probe.b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from probe.c import h\n",
        "probe.c": "import probe.d\n",
        "probe.d": "class K:\n    def m(self):\n        from probe import a\n",
    }
    modules = {m: tmp_path / (m.replace(".", "/") + ".py") for m in files}
    for m, text in files.items():
        modules[m].write_text(text)
    imports = [i for m, p in modules.items() for i in _imports(m, p, modules)]
    assert [i.lazy for i in imports] == [True, False, True, False, True]
    assert _cycles(module_edges(imports, modules)) == [["probe.a", "probe.b", "probe.c", "probe.d", "probe.a"]]
    modules["probe.d"].write_text("class K:\n    pass\n")
    imports = [i for m, p in modules.items() for i in _imports(m, p, modules)]
    assert _cycles(module_edges(imports, modules)) == []


def test_a_sibling_read_off_a_reexporting_package_is_a_cycle(tmp_path):
    (tmp_path / "pkg").mkdir()
    modules = {"pkg": tmp_path / "pkg" / "__init__.py", "pkg.a": tmp_path / "pkg" / "a.py",
               "pkg.b": tmp_path / "pkg" / "b.py"}
    modules["pkg"].write_text("from pkg.a import f\n")
    modules["pkg.b"].write_text("x = 1\n")

    def cycles(a_text: str) -> list[list[str]]:
        modules["pkg.a"].write_text(a_text)
        return _cycles(module_edges([i for m, p in modules.items() for i in _imports(m, p, modules)], modules))
    assert cycles("from pkg import b\n") == [["pkg", "pkg.a", "pkg"]]
    assert cycles("import pkg.b as b\n") == []
    assert cycles("from pkg.b import x\n") == []


def test_the_table_refuses_a_planted_import():
    assert allowed(Import("cake_core.ir.interp", "cake_core.problems.base", 1, True)) is not None
    assert allowed(Import("cake_core.problems.base", "cake_core.runtime.gpu", 1, True)) is not None
    assert allowed(Import("cake_core.runtime.gpu", "cupy", 1, False)) is not None       # lazily only
    assert allowed(Import("cake_core.runtime.gpu", "cupy", 1, True)) is None
    assert allowed(Import("cake_core.targets.arch", "numpy", 1, False)) is not None
    assert allowed(Import("cake_core.targets.arch", "cake_core.errors", 1, False)) is None
    assert allowed(Import("cake_core.lower.cuda", "cake_core.ir.ops", 1, False)) is None


def render_table() -> list[str]:
    """TABLE as the Markdown rows of docs/architecture.md."""
    def name(x: str) -> str:
        return f"`{x}/`" if "/" in x or x in FIRST_PARTY else ("standard library" if x == "stdlib" else f"{x}"
                                                               + (" (lazily)" if x in LAZY else ""))
    rows = ["| folder | may import |", "|---|---|"]
    for folder, may in TABLE.items():
        rows.append(f"| `{folder}/` | {', '.join(name(x) for x in may)} |")
    return rows


def test_the_documented_table_is_the_enforced_one():
    text = DOC.read_text()
    missing = [r for r in render_table() if r not in text.splitlines()]
    assert not missing, "docs/architecture.md's import table differs from tests/test_architecture.py's TABLE; " \
                        "these rows are missing from the doc:\n" + "\n".join(missing)


def test_the_readme_points_to_the_architecture_inside_the_repository():
    readme = (ROOT / "README.md").read_text()
    assert "docs/architecture.md" in readme and "../shared" not in readme and "DESIGN.md" not in readme


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for n in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
    return names


def unresolved_imports(modules: dict[str, Path]) -> list[str]:
    """First-party ``from X import y`` anywhere in a module (inside functions too, where an import runs only
    when its path does) whose module X or name y does not exist."""
    defined = {m: None for m in modules}
    bad = []

    def where(path: Path) -> str:
        return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
    for module, path in modules.items():
        for n in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(n, ast.ImportFrom) or n.level or not n.module:
                continue
            if n.module.split(".")[0] not in FIRST_PARTY:
                continue
            if n.module not in modules:
                bad.append(f"{where(path)}:{n.lineno}: no module {n.module}")
                continue
            if defined[n.module] is None:
                defined[n.module] = _top_level_names(modules[n.module])
            for a in n.names:
                if a.name != "*" and f"{n.module}.{a.name}" not in modules and a.name not in defined[n.module]:
                    bad.append(f"{where(path)}:{n.lineno}: {n.module} has no {a.name}")
    return bad


def test_every_first_party_import_resolves_also_inside_functions():
    assert unresolved_imports(MODULES) == []


def test_an_import_of_a_missing_module_inside_a_function_is_found(tmp_path):
    good = tmp_path / "good.py"
    good.write_text("def f():\n    from tasks.final import final\n")
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from cake_core.problems.nowhere import peer_names\n"
                   "    from cake_core.runtime.peers import no_such_name\n")
    found = unresolved_imports({**MODULES, "probe.good": good, "probe.bad": bad})
    assert [f.split(": ", 1)[1] for f in found] == ["no module cake_core.problems.nowhere",
                                                     "cake_core.runtime.peers has no no_such_name"]
