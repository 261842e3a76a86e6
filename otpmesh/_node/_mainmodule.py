"""How a worker finds the actor classes of the controller's ``__main__``.

A class is named by import path; ``__main__:Greeter`` is the controller's main module, which a
worker rebuilds as ``__otpmesh_main__``. What it rebuilds it from is handed over at fork time by
the worker's parent, inside the fork request (the fork server's private socket pair, or a host
agent's ``spawn_proc`` from its controller), never taken from a message:

- a script (``python job.py``, ``otpmesh run``): its file's path; the worker imports the file,
  so its ``if __name__ == "__main__":`` block does not run;
- a program without a file, ``python -c CODE`` (the code, from ``sys.orig_argv``) or a Jupyter
  kernel or IPython (the cells run so far, from IPython's history): their *definitions*. The
  controller keeps each top-level ``import``, ``def``, ``class`` and assignment of a literal
  (``N = 4``), the latest of each name, and blanks every other line (so line numbers, and the
  lines tracebacks show, stay the cell's own); a worker runs them statement by statement. What
  a cell does (load data, start the app, ``await``) runs in the controller only.

Standard input and a plain interactive prompt leave nothing to rebuild from: a spawn then says to
put the class in a file or pass the program with ``python -c``.

The controller's ``sys.argv`` travels with it, and a worker takes it before it runs any of the
user's code: a main file whose module level reads its arguments (``MARK = sys.argv[1]``)
computes the same values in every process, as under multiprocessing's spawn, Ray and Monarch.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import linecache
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .._core._actor import MAIN_ALIAS, Actor
from .._core._errors import SpawnError

#: The most definitions' source a fork request carries (its packet holds 1 MiB in all).
MAX_SOURCE = 256 * 1024

_NO_SOURCE = (
    "its source is gone (it was read from standard input or typed at a prompt): define the "
    "class in a module the workers can import, or in the script you run, or pass the program "
    "with python -c"
)


@dataclass(frozen=True, slots=True)
class MainModule:
    """What a worker rebuilds the controller's ``__main__`` from: a file, or the definitions of
    sources without one (``(name, text)`` chunks: a ``python -c`` program, notebook cells), and
    the arguments it runs with (the controller's ``sys.argv``; empty: leave the worker's)."""

    path: str | None = None
    chunks: tuple[tuple[str, str], ...] = ()
    argv: tuple[str, ...] = ()

    def to_cfg(self) -> dict[str, Any]:
        return {
            "main": self.path,
            "main_source": [list(chunk) for chunk in self.chunks],
            "argv": list(self.argv),
        }

    @classmethod
    def from_cfg(cls, cfg: dict[str, Any]) -> MainModule:
        chunks = cfg.get("main_source") or []
        return cls(
            cfg.get("main"),
            tuple((str(name), str(text)) for name, text in chunks),
            tuple(str(arg) for arg in cfg.get("argv") or ()),
        )


# ---------------------------------------------------------------------- the controller's side


def this_main() -> MainModule:
    """What this process's ``__main__`` can be rebuilt from in a worker, and its arguments."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    argv = tuple(sys.argv)
    if isinstance(path, str) and not path.startswith("<"):
        return MainModule(path=path, argv=argv)
    sources = _ipython_cells() or _command()
    chunks = _definitions(sources)
    size = sum(len(text) for _, text in chunks)
    if size > MAX_SOURCE:
        raise SpawnError(
            f"the definitions of this program's __main__ come to {size} bytes, more than "
            f"{MAX_SOURCE} a worker is handed: move the actor classes into a module and import it"
        )
    return MainModule(chunks=chunks, argv=argv)


def _command() -> list[tuple[str, str]]:
    """``python -c CODE``'s code (``sys.orig_argv`` keeps it: ``sys.argv`` does not)."""
    argv = list(getattr(sys, "orig_argv", []))
    for i, arg in enumerate(argv[1:-1], start=1):
        if arg == "-c":
            return [("<python -c>", argv[i + 1])]
        if not arg.startswith("-") or arg == "-m":
            break  # a script or a module: not a -c program
    return []


def _ipython_cells() -> list[tuple[str, str]]:
    """The cells an IPython shell (a Jupyter kernel, the ``ipython`` prompt) has run so far, as
    Python (magics already turned into calls)."""
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython is not None else None
    if shell is None:
        return []
    cells = list(shell.history_manager.input_hist_parsed)
    return [(f"<cell {n}>", text) for n, text in enumerate(cells) if text.strip()]


def _definitions(sources: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Each source's definitions, other lines blanked; a name defined again later is kept only
    where it is defined last, and an import only where it first appears."""
    parsed: list[tuple[str, list[str], list[ast.stmt]]] = []
    for name, text in sources:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue  # a cell that did not run either
        parsed.append((name, text.splitlines(), [s for s in tree.body if _is_definition(s)]))
    chosen: dict[str, ast.stmt] = {}
    for _, _, stmts in parsed:
        for stmt in stmts:
            if not isinstance(stmt, ast.Import | ast.ImportFrom) or _key(stmt) not in chosen:
                chosen[_key(stmt)] = stmt  # the latest definition; the first import
    kept = {id(stmt) for stmt in chosen.values()}
    chunks = []
    for name, lines, stmts in parsed:
        keep = [False] * len(lines)
        for stmt in stmts:
            if id(stmt) in kept:
                first = min([stmt.lineno, *(d.lineno for d in _decorators(stmt))])
                end = stmt.end_lineno or stmt.lineno
                keep[first - 1 : end] = [True] * (end - first + 1)
        if any(keep):
            text = "\n".join(line if k else "" for line, k in zip(lines, keep, strict=True))
            chunks.append((name, text.rstrip() + "\n"))
    return tuple(chunks)


def _is_definition(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Import | ast.ImportFrom | ast.FunctionDef | ast.AsyncFunctionDef):
        return True
    if isinstance(stmt, ast.ClassDef):
        return True
    if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        if all(isinstance(t, ast.Name) for t in targets):
            try:
                ast.literal_eval(stmt.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return False
            return True
    return False


def _key(stmt: ast.stmt) -> str:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return f"name:{stmt.name}"
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        return f"name:{ast.unparse(stmt.targets[0])}"
    if isinstance(stmt, ast.AnnAssign):
        return f"name:{ast.unparse(stmt.target)}"
    return ast.unparse(stmt)  # imports (and multiple targets): once each


def _decorators(stmt: ast.stmt) -> list[ast.expr]:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return stmt.decorator_list
    return []


# ---------------------------------------------------------------------- the worker's side


def take_argv(main: MainModule) -> None:
    """Give this worker the controller's ``sys.argv``: called once, before any of the user's
    code runs here (an actor's module, or the main file, may read its arguments as it loads)."""
    if main.argv:
        sys.argv[:] = main.argv


def load_main(main: MainModule) -> ModuleType:
    """The controller's ``__main__`` as ``__otpmesh_main__``, built once per worker."""
    module = sys.modules.get(MAIN_ALIAS)
    if module is not None:
        return module
    if main.path:
        spec = importlib.util.spec_from_file_location(MAIN_ALIAS, main.path)
        if spec is None or spec.loader is None:
            raise SpawnError(f"cannot import the controller's main file {main.path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[MAIN_ALIAS] = module
        spec.loader.exec_module(module)
        return module
    module = ModuleType(MAIN_ALIAS)
    sys.modules[MAIN_ALIAS] = module
    for name, text in main.chunks:
        _run_definitions(module, name, text)
    return module


def _run_definitions(module: ModuleType, name: str, text: str) -> None:
    """Run one chunk's statements one by one: a definition the worker cannot run (an import
    only the controller has) is remembered, and named if a class that needed it is missing."""
    lines = text.splitlines(keepends=True)
    linecache.cache[name] = (len(text), None, lines, name)  # tracebacks show the lines
    flags = 0
    for stmt in ast.parse(text, name).body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            for alias in stmt.names:
                flags |= getattr(__import__("__future__"), alias.name).compiler_flag
            continue
        code = compile(ast.Module([stmt], []), name, "exec", flags=flags, dont_inherit=True)
        try:
            exec(code, module.__dict__)
        except Exception as exc:
            failed: list[str] = module.__dict__.setdefault("__otpmesh_failed__", [])
            failed.append(f"{name} line {stmt.lineno}: {type(exc).__name__}: {exc}")


def main_class(main: MainModule, path: str, qualname: str) -> Any:
    """The object `qualname` of the controller's ``__main__``; SpawnError saying why not."""
    if not main.path and not main.chunks:
        raise SpawnError(f"{path}: the controller's __main__ has no file, and {_NO_SOURCE}")
    module = load_main(main)
    try:
        return _lookup(module, qualname)
    except AttributeError:
        failed = module.__dict__.get("__otpmesh_failed__") or []
        where = "main file" if main.path else "definitions (python -c, or notebook cells)"
        why = f"; these of its definitions failed here: {'; '.join(failed)}" if failed else ""
        raise SpawnError(f"{path}: the controller's {where} define no {qualname}{why}") from None


def import_class(path: str, main: MainModule) -> type[Actor]:
    """Import an actor class by 'module:QualName' (``__main__``: as ``main`` says)."""
    module_name, _, qualname = path.partition(":")
    if module_name == "__main__":
        obj = main_class(main, path, qualname)
    else:
        obj = _lookup(importlib.import_module(module_name), qualname)
    if not (isinstance(obj, type) and issubclass(obj, Actor)):
        raise SpawnError(f"{path} is not an otpmesh.Actor subclass")
    return obj


def _lookup(module: ModuleType, qualname: str) -> Any:
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj
