"""The architecture, enforced: which layer may import which, and no import cycle anywhere.

Layers, lowest first (docs/architecture.md):

    _core -> _wire -> _node -> rdma -> _runtime -> _controller -> _hosts -> public -> _cli

("public": the package's own ``__init__`` and its public modules: chaos, launchers,
bench (the benchmarks' package), testing; the command line sits above them.)

A module may import its own layer and the layers below it, never above. The core imports
neither trio nor sockets (nor msgpack): it is pure. Every import counts: function-level (lazy)
ones, and those under ``if TYPE_CHECKING:`` too (a cycle the type checker needs is still a
cycle in the design).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "otpmesh"
LAYERS = ["_core", "_wire", "_node", "rdma", "_runtime", "_controller", "_hosts", "public", "_cli"]
#: Top-level modules and packages of the public layer.
PUBLIC = {"chaos", "launchers", "bench", "testing"}
#: Third-party and standard modules the pure core must not import.
IMPURE = {"trio", "socket", "msgpack", "selectors", "asyncio", "torch"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported module or name) for every import in `path`, TYPE_CHECKING ones included."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
    return found


def _layer(module: str) -> str | None:
    """The layer of an otpmesh module (None: not otpmesh's)."""
    parts = module.split(".")
    if parts[0] != "otpmesh":
        return None
    if len(parts) == 1 or parts[1] in PUBLIC or parts[1] == "__version__":
        return "public"
    if parts[1] == "__main__":
        return "_cli"
    return parts[1] if parts[1] in LAYERS else "public"  # a name of otpmesh/__init__.py


MODULES = _modules()
GRAPH = {
    name: [(line, target) for line, target in _imports(name, path)]
    for name, path in MODULES.items()
}


def _rank(layer: str) -> int:
    return LAYERS.index(layer)


def test_every_module_belongs_to_a_layer() -> None:
    stray = [
        name
        for name in MODULES
        if name.count(".") == 1 and name.split(".")[1].startswith("_")
        if name.split(".")[1] not in LAYERS and name.split(".")[1] != "__main__"
    ]
    assert stray == [], f"private modules outside the layer packages: {stray}"


@pytest.mark.parametrize("layer", [layer for layer in LAYERS if layer != "public"])
def test_a_layer_imports_only_itself_and_the_layers_below(layer: str) -> None:
    wrong = []
    for name, imports in GRAPH.items():
        if _layer(name) != layer:
            continue
        for line, target in imports:
            other = _layer(target)
            if other is not None and _rank(other) > _rank(layer):
                wrong.append(f"{MODULES[name].relative_to(PACKAGE.parent)}:{line} imports {target}")
    assert wrong == [], f"{layer} reaches up a layer:\n" + "\n".join(sorted(set(wrong)))


def test_the_core_is_pure() -> None:
    wrong = [
        f"{MODULES[name].relative_to(PACKAGE.parent)}:{line} imports {target}"
        for name, imports in GRAPH.items()
        if _layer(name) == "_core"
        for line, target in imports
        if target.split(".")[0] in IMPURE
    ]
    assert wrong == [], "the core must not import trio, sockets or msgpack:\n" + "\n".join(wrong)


def test_the_wire_knows_nothing_of_the_controller_or_the_tensor_channel() -> None:
    wrong = [
        f"{MODULES[name].relative_to(PACKAGE.parent)}:{line} imports {target}"
        for name, imports in GRAPH.items()
        if _layer(name) == "_wire"
        for line, target in imports
        if _layer(target) in ("_controller", "rdma", "_runtime", "_hosts", "_cli")
    ]
    assert wrong == [], "\n".join(wrong)


def test_there_is_no_import_cycle() -> None:
    edges = {
        name: sorted({t for _, t in imports if t in MODULES and t != name})
        for name, imports in GRAPH.items()
    }
    # Tarjan's strongly connected components: any of more than one module is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    assert cycles == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_checks_catch_what_they_claim_to(tmp_path: Path) -> None:
    """The layer rule, run on a made-up module of the core that imports trio and the
    controller, and the hosts for the type checker only, names all three offending imports."""
    fake = tmp_path / "fake.py"
    fake.write_text(
        "import trio\nfrom .._controller._app import App\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .._hosts._agent import Agent\n"
    )
    found = _imports("otpmesh._core.fake", fake)
    assert (1, "trio") in found
    assert (2, "otpmesh._controller._app.App") in found
    assert (5, "otpmesh._hosts._agent.Agent") in found
    assert _rank(_layer("otpmesh._controller._app") or "public") > _rank("_core")
