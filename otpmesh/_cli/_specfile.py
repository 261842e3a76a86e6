"""Finding a supervision tree (or a driver) by name: ``supervisors/rl_pipeline.py``,
``supervisors.rl_pipeline``, either with ``:attr`` (default ``tree``).

The module is imported under a real module name, with its root on ``sys.path``, because worker
processes import the actor classes it defines by that name (they inherit ``sys.path``).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

from .._core._errors import UsageError
from .._core._spec import Mesh, Supervisor

DEFAULT_ATTR = "tree"


#: A driver: ``async def main()`` that starts its own trees (``otpmesh run job.py:main``).
Driver = Callable[[], Awaitable[Any]]


def load_tree(target: str) -> Supervisor | Mesh:
    """The spec `target` names. An attribute that is a function is called with no arguments
    (``supervisors/rl_pipeline.py:make_tree``)."""
    found = load_target(target)
    if not isinstance(found, Supervisor | Mesh):
        raise UsageError(f"{target} is a driver (an async function), not a tree")
    return found


def load_target(target: str) -> Supervisor | Mesh | Driver:
    """The spec `target` names, or the driver it names: an ``async def`` taking no arguments,
    run as the program's main (``job.py:main``). Another function is called with no arguments
    and must return a spec (``supervisors/rl_pipeline.py:make_tree``)."""
    where, attr = _split(target)
    module = _import_file(where) if _is_file(where) else _import_module(where)
    if not hasattr(module, attr):
        hint = (
            f"define `{DEFAULT_ATTR} = Supervisor(...)` at module level, or name it: {where}:NAME"
            if attr == DEFAULT_ATTR
            else f"name an attribute {module.__name__} has"
        )
        raise UsageError(f"{where} has no attribute {attr!r}: {hint}")
    value = getattr(module, attr)
    if inspect.iscoroutinefunction(value):
        driver: Driver = value
        return driver
    if callable(value) and not isinstance(value, Supervisor | Mesh | type):
        value = value()
    if not isinstance(value, Supervisor | Mesh):
        raise UsageError(
            f"{where}:{attr} is a {type(value).__name__}, not a tree: it must be an "
            "otpmesh.Supervisor or otpmesh.Mesh (or a function returning one), or an async "
            "function that starts its own trees"
        )
    return value


def _split(target: str) -> tuple[str, str]:
    where, colon, attr = target.rpartition(":")
    if colon and attr.isidentifier() and where:
        return where, attr
    return target, DEFAULT_ATTR


def _is_file(where: str) -> bool:
    return where.endswith(".py") or os.sep in where or os.path.exists(where)


def _import_file(path: str) -> ModuleType:
    if not os.path.isfile(path):
        raise UsageError(f"no such file: {path}")
    path = os.path.abspath(path)
    root, name = _module_name(path)
    if root not in sys.path:
        sys.path.insert(0, root)
    module = _import(name, root)
    found = getattr(module, "__file__", None)
    if found is None or not os.path.samefile(found, path):
        raise UsageError(
            f"{path} would be imported as module {name!r}, but that name is already taken by "
            f"{found or 'a built-in module'}: rename the file"
        )
    return module


def _module_name(path: str) -> tuple[str, str]:
    """(the directory to put on sys.path, the dotted name) of a file, packages included."""
    directory, filename = os.path.split(path)
    parts = [] if filename == "__init__.py" else [filename.removesuffix(".py")]
    while os.path.isfile(os.path.join(directory, "__init__.py")):
        directory, package = os.path.split(directory)
        parts.insert(0, package)
    if not parts:
        raise UsageError(f"{path} is a package's __init__.py outside any package")
    return directory, ".".join(parts)


def _import_module(name: str) -> ModuleType:
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    return _import(name, cwd)


def _import(name: str, where: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            raise UsageError(f"no module named {name!r} (looked in {where} and sys.path)") from None
        raise  # the module itself imports something missing: the traceback says where
