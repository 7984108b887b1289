"""Finding problems: the built-in folders, installed packages' entry points, and problem paths.

A problem is a package whose ``__init__.py`` defines ``PROBLEM = Problem(...)`` beside its ``kernels/`` (the
naive seed, the hand-written references) and ``shapes/`` (its shape sets). Three places announce them, looked
at in this order, the first to use a name keeping it:

- **built-in**: every folder of ``cake_core/problems/`` that is such a package;
- **entry point**: an installed distribution's ``cake.problems`` entry point, ``name = "module:PROBLEM"``
  (imported lazily, as pytest and pluggy import their plugins);
- **path**: a folder named with ``--problem-path DIR``, the ``problem_path`` setting or ``CAKE_PROBLEM_PATH``
  (``os.pathsep``-separated): a problem package itself, or a folder of them.

Every problem is checked on load (its fields, its seed parses and declares the problem's tensors, its
references and shape sets exist); one that fails is *broken*: it is listed with one line that says which
file and what is wrong (:class:`Broken`), and never takes the others down.

Each problem carries an importable reference (``ref``): ``module:attr`` or ``path:DIR``. A Problem pickled
to another process (a Ray worker) travels as that reference and is loaded again there (:func:`rebuild`), so
a plugin problem runs on a cluster whose workers never saw the driver's registry.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

from cake_core.errors import CakeError
import cake_core.problems.base as _base
from cake_core.problems.base import Problem, ProblemSpecError, UnknownProblem

ENTRY_POINT_GROUP = "cake.problems"
PATH_ENV = "CAKE_PROBLEM_PATH"
BUILTIN_DIR = Path(__file__).resolve().parent
_NOT_PROBLEMS = {"common", "__pycache__"}


@dataclass(frozen=True)
class Broken:
    """A problem that could not be loaded: where it was announced, the file at fault, and what is wrong."""

    source: str          # built-in, entry point DIST, path DIR
    where: str           # the file (and line) at fault, or the entry point
    message: str

    def line(self) -> str:
        return f"{self.where}: {self.message} ({self.source})"


@dataclass
class Catalogue:
    problems: dict[str, Problem]
    broken: list[Broken]


_paths: list[Path] = []
_catalogue: Catalogue | None = None
_by_ref: dict[str, Problem] = {}
_by_name: dict[str, Problem] = {}      # problems loaded by reference in this process, findable by name after


def use_problem_paths(paths: Iterable[str | os.PathLike[str]]) -> None:
    """Add problem folders to this process's catalogue (``--problem-path``, the ``problem_path`` setting)."""
    global _catalogue
    added = [Path(p).expanduser().resolve() for p in paths if str(p)]
    new = [p for p in added if p not in _paths]
    if new:
        _paths.extend(new)
        _catalogue = None


def problem_paths() -> list[Path]:
    """The problem paths in force: those given to :func:`use_problem_paths`, then ``CAKE_PROBLEM_PATH``'s."""
    env = [Path(p).expanduser().resolve() for p in os.environ.get(PATH_ENV, "").split(os.pathsep) if p.strip()]
    return _paths + [p for p in env if p not in _paths]


def catalogue() -> Catalogue:
    """Every problem this process can find, and the broken ones (discovered once, then kept)."""
    global _catalogue
    if _catalogue is None:
        _catalogue = _discover()
    return _catalogue


def list_problems() -> list[Problem]:
    return list(catalogue().problems.values())


def get_problem(problem: str | Problem) -> Problem:
    """The problem named ``problem`` (or at reference ``module:attr`` / ``path:DIR``; a Problem is returned
    as it is). An unknown name raises :class:`UnknownProblem` listing the known ones; a broken one, its line."""
    if isinstance(problem, Problem):
        return problem
    if is_ref(problem):
        return load_ref(problem)
    found = find_problem(problem)
    if found is not None:
        return found
    cat = catalogue()
    broken = [b for b in cat.broken if _names(b, problem)]
    if broken:
        raise UnknownProblem(f"problem `{problem}` is broken: {broken[0].line()}")
    raise UnknownProblem(f"unknown problem `{problem}`; known: {', '.join(cat.problems) or 'none'} "
                         "(`cake problems` lists them; a problem of your own is a folder passed with "
                         "--problem-path DIR)")


def find_problem(name: str) -> Problem | None:
    """The problem named ``name`` in this process (catalogue, or loaded by reference), None when there is none."""
    return catalogue().problems.get(name) or _by_name.get(name)


def _names(b: Broken, name: str) -> bool:
    """Whether broken problem ``b`` is the one a user asks for by ``name`` (its folder or module says so)."""
    return re.search(rf"\b{re.escape(name)}\b", b.where + " " + b.source) is not None


def is_ref(text: str) -> bool:
    """True when ``text`` is a problem reference (``module:attr`` or ``path:DIR``), not a name."""
    return text.startswith("path:") or ":" in text


def loaded(ref: str) -> Problem | None:
    """The problem already loaded in this process at ``ref`` (None: not yet)."""
    if ref in _by_ref:
        return _by_ref[ref]
    if _catalogue is not None:
        return next((p for p in _catalogue.problems.values() if p.ref == ref), None)
    return None


def rebuild(ref: str, changed: dict[str, Any]) -> Problem:
    """The problem at ``ref`` with the fields ``changed`` replaced: how a pickled Problem is loaded again."""
    base = loaded(ref) or load_ref(ref)
    return replace(base, **changed) if changed else base


def load_ref(ref: str) -> Problem:
    """Load (once per process) the problem at ``ref``: ``path:DIR`` or ``module:attr``."""
    if ref in _by_ref:
        return _by_ref[ref]
    if ref.startswith("path:"):
        folder = Path(ref[len("path:"):])
        problem = _checked(_load_folder(folder))
    else:
        module, _, attr = ref.partition(":")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except Exception as e:  # noqa: BLE001 - any import error becomes one line
            raise UnknownProblem(f"problem reference `{ref}`: {_one_line(e)}") from None
        problem = _as_problem(obj, ref)
        problem = _checked(replace(problem, root=problem.root or _module_dir(module), ref=ref,
                                   source=problem.source or f"module {module}"))
    _by_ref[ref] = problem
    _by_name.setdefault(problem.name, problem)
    return problem


# ---------------------------------------------------------------- discovery

def _discover() -> Catalogue:
    problems: dict[str, Problem] = {}
    broken: list[Broken] = []

    def add(source: str, where: str, load) -> None:
        try:
            p = load()
        except Exception as e:  # noqa: BLE001 - a broken problem is listed, never raised
            broken.append(Broken(source, _where(e, where), _one_line(e)))
            return
        if p.name in problems:
            broken.append(Broken(source, where, f"problem name `{p.name}` is taken by the "
                                                f"{problems[p.name].source} problem; rename it"))
            return
        problems[p.name] = p
        _by_ref.setdefault(p.ref, p)

    for folder in sorted(BUILTIN_DIR.iterdir()):
        if folder.is_dir() and folder.name not in _NOT_PROBLEMS and (folder / "__init__.py").is_file():
            ref = f"cake_core.problems.{folder.name}:PROBLEM"
            add("built-in", str(folder / "__init__.py"), lambda ref=ref, folder=folder: _builtin(ref, folder))
    for ep in _entry_points():
        dist = getattr(getattr(ep, "dist", None), "name", "?")
        add(f"entry point {dist}", f"entry point {ep.name} = {ep.value}",
            lambda ep=ep, dist=dist: _entry(ep, dist))
    for path in problem_paths():
        for folder in _problem_folders(path, broken):
            add(f"path {path}", str(folder / "__init__.py"), lambda folder=folder, path=path: _path(folder, path))
    return Catalogue(problems, broken)


def _entry_points() -> list[Any]:
    try:
        return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    except Exception:  # noqa: BLE001 - broken distribution metadata must not take the built-ins down
        return []


def _builtin(ref: str, folder: Path) -> Problem:
    module, _, attr = ref.partition(":")
    p = _as_problem(getattr(importlib.import_module(module), attr, None), ref)
    return _checked(replace(p, root=p.root or folder, ref=ref, source="built-in"))


def _entry(ep: Any, dist: str) -> Problem:
    obj = ep.load()
    if not isinstance(obj, Problem) and hasattr(obj, "PROBLEM"):
        obj = obj.PROBLEM
    p = _as_problem(obj, ep.value)
    module = ep.value.partition(":")[0]
    root = p.root or _module_dir(module)
    return _checked(replace(p, root=root, ref=ep.value, source=f"entry point {dist}"))


def _path(folder: Path, path: Path) -> Problem:
    return _checked(replace(_load_folder(folder), source=f"path {folder}"))


def _problem_folders(path: Path, broken: list[Broken]) -> list[Path]:
    if not path.is_dir():
        broken.append(Broken(f"path {path}", str(path), "no such folder; pass a problem folder (one holding "
                                                        "__init__.py with PROBLEM) or a folder of them"))
        return []
    if (path / "__init__.py").is_file():
        return [path]
    found = sorted(d for d in path.iterdir() if d.is_dir() and (d / "__init__.py").is_file())
    if not found:
        broken.append(Broken(f"path {path}", str(path), "holds no problem folder (a folder with an __init__.py "
                                                        "that defines PROBLEM)"))
    return found


def _load_folder(folder: Path) -> Problem:
    """Import the problem package at ``folder`` under a module name of its own, and return its PROBLEM."""
    folder = folder.resolve()
    init = folder / "__init__.py"
    if not init.is_file():
        raise ProblemSpecError(f"{folder} holds no __init__.py; a problem folder defines PROBLEM there")
    digest = hashlib.sha1(str(folder).encode()).hexdigest()[:8]
    name = f"cake_problem_{re.sub(r'[^0-9A-Za-z_]', '_', folder.name)}_{digest}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(folder)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
    p = _as_problem(getattr(module, "PROBLEM", None), str(init))
    return replace(p, root=p.root or folder, ref=f"path:{folder}", source=p.source or f"path {folder}")


def _as_problem(obj: Any, where: str) -> Problem:
    if obj is None:
        raise ProblemSpecError("defines no PROBLEM; write PROBLEM = Problem(...) in the package's __init__.py")
    if not isinstance(obj, Problem):
        raise ProblemSpecError(f"PROBLEM is a {type(obj).__name__}, not a cake_core.problems.Problem")
    return obj


def _module_dir(module: str) -> Path | None:
    m = sys.modules.get(module)
    f = getattr(m, "__file__", None)
    return Path(f).resolve().parent if f else None


# ---------------------------------------------------------------- checks on load

def _checked(p: Problem) -> Problem:
    """``p`` if its definition holds together, else :class:`ProblemSpecError` naming the first mistake."""
    from cake_core.ir.text import parse     # lazily: checking a problem parses its programs

    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p.name or ""):
        raise ProblemSpecError(f"problem name {p.name!r} must be an identifier")
    if p.root is None:
        raise ProblemSpecError(f"problem `{p.name}` has no folder (root)")
    for f in ("make_inputs", "oracle", "flops", "bytes"):
        if not callable(getattr(p, f)):
            raise ProblemSpecError(f"problem `{p.name}`: {f} must be a function, got {type(getattr(p, f)).__name__}")
    if not p.dims:
        raise ProblemSpecError(f"problem `{p.name}` declares no dims")
    if not p.outputs:
        raise ProblemSpecError(f"problem `{p.name}` declares no output (or state) tensor")
    if not p.perturbed:
        raise ProblemSpecError(f"problem `{p.name}` declares no float (data or state) input for the perturbation "
                               "check")
    bad_state = [n for n in p.states if n in p.zeroed_outputs]
    if bad_state:
        raise ProblemSpecError(f"problem `{p.name}`: state {', '.join(bad_state)} cannot be zeroed (its drawn value "
                               "is what the kernel updates)")
    names = [t.name for t in p.tensors]
    if len(set(names)) != len(names):
        raise ProblemSpecError(f"problem `{p.name}` declares a tensor name twice: {', '.join(names)}")
    bad_zero = [n for n in p.zeroed_outputs if n not in p.outputs]
    if bad_zero:
        raise ProblemSpecError(f"problem `{p.name}`: zeroed_outputs {', '.join(bad_zero)} are not outputs")
    for n, f in p.peers.items():
        if not callable(f):
            raise ProblemSpecError(f"problem `{p.name}`: peer `{n}` is not a function")
    if not (p.rtol > 0):
        raise ProblemSpecError(f"problem `{p.name}`: rtol must be above 0, got {p.rtol}")
    for f in [p.seed_file, *p.best_files]:
        path = p.kernels_dir / f
        if not path.is_file():
            raise ProblemSpecError(f"problem `{p.name}`: no kernel file {path}")
        parsed = parse(path.read_text(), str(path))
        if not parsed.ok:
            d = next(d for d in parsed.diagnostics if d.is_error)
            raise ProblemSpecError(f"{path}:{d.line}: {f} does not parse: {d.message} [{d.rule}]")
        why = p.program_mismatch(parsed.program)
        if why:
            raise ProblemSpecError(f"{path}: {why}")
    for s in p.shape_sets:
        if not (p.shapes_dir / f"{s}.csv").is_file():
            raise ProblemSpecError(f"problem `{p.name}`: shape set `{s}` has no file {p.shapes_dir / (s + '.csv')}")
    if p.bench is not None and not (p.shapes_dir / f"{p.bench.shape_set}.csv").is_file():
        raise ProblemSpecError(f"problem `{p.name}`: bench shape set `{p.bench.shape_set}` has no file")
    return p


def _one_line(e: BaseException) -> str:
    if isinstance(e, SyntaxError):
        return f"syntax error: {e.msg}"
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text if isinstance(e, CakeError) else f"{type(e).__name__}: {text}"


def _where(e: BaseException, default: str) -> str:
    """The file and line at fault: a syntax error's own, else the innermost frame outside Cake and Python."""
    if isinstance(e, SyntaxError) and e.filename:
        return f"{e.filename}:{e.lineno}"
    ours = str(Path(__file__).resolve().parents[1])
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if not f.filename.startswith(ours) and "importlib" not in f.filename and "<frozen" not in f.filename]
    if frames:
        return f"{frames[-1].filename}:{frames[-1].lineno}"
    return default


_base._registry = sys.modules[__name__]     # how a Problem pickles as its reference (Problem.__reduce_ex__)
