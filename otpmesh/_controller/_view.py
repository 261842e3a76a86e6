"""``app.view()``: the running tree as a rich tree, for a notebook cell or a terminal.

Read from what is running now (``which_children`` at every level, owned subtrees under their
owners), not from the event log: each supervisor with its strategy and intensity, each child
with its status and incarnation. A rich renderable: a notebook shows it as a cell's value,
``rich.print(app.view())`` prints it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from rich.tree import Tree

from .._core._children import ChildInfo, ChildStatus
from .._core._spec import Mesh, Supervisor, Worker

if TYPE_CHECKING:
    from ._tree import TreeContext

_STYLE = {
    ChildStatus.RUNNING: "green",
    ChildStatus.RESTARTING: "yellow",
    ChildStatus.UNDEFINED: "dim",
}


def view(ctx: TreeContext) -> Tree:
    """The tree `ctx` runs, with the trees its actors own, as they are now."""
    spec = ctx.tree
    top = Tree(_supervisor_label(spec.id, spec))
    _children(top, ctx, ctx.root.path)
    return top


def _children(branch: Tree, ctx: TreeContext, sup_path: str) -> None:
    try:
        children = ctx.which_children(sup_path)
    except KeyError:  # stopped meanwhile
        branch.add(Text("(not running)", style="dim"))
        return
    for child in reversed(children):  # which_children is newest first; show start order
        path = f"{sup_path}/{child.id}"
        if child.type == "supervisor" and child.status is not ChildStatus.UNDEFINED:
            sub = branch.add(_supervisor_label(child.id, child.spec, child))
            _children(sub, ctx, path)
        else:
            leaf = branch.add(_worker_label(child))
            for owned in _owned_by(ctx, path):
                sub = leaf.add(_supervisor_label(owned.tree.id, owned.tree, owned=True))
                _children(sub, owned, owned.root.path)


def _owned_by(ctx: TreeContext, owner: str) -> list[TreeContext]:
    """The trees the actor at `owner` owns, found at any depth of `ctx`'s own."""
    found = []
    for sub in ctx.subtrees:
        if sub.root.path.rsplit("/", 1)[0] == owner:
            found.append(sub)
    return found


def _supervisor_label(
    name: str, spec: object, info: ChildInfo | None = None, *, owned: bool = False
) -> Text:
    text = Text(name, style="bold")
    if isinstance(spec, Mesh):
        shape = "x".join(str(n) for n in spec.shape.values())
        text.append(f"  mesh {shape} of {_class_name(spec.actor)}", style="cyan")
    if isinstance(spec, Supervisor | Mesh):
        text.append(f"  {spec.strategy.value}, intensity {spec.intensity}/{spec.period:g} s")
    if owned:
        text.append("  (owned)", style="magenta")
    if info is not None:
        text.append(f"  {_status(info)}", style=_STYLE.get(info.status, ""))
    return text


def _worker_label(info: ChildInfo) -> Text:
    text = Text(info.id, style="bold")
    spec = info.spec
    if isinstance(spec, Worker):
        text.append(f"  {_class_name(spec.actor)}", style="cyan")
    text.append(f"  {_status(info)}", style=_STYLE.get(info.status, ""))
    if info.incarnation > 1:
        text.append(f"  incarnation {info.incarnation}", style="yellow")
    return text


def _status(info: ChildInfo) -> str:
    return "not running" if info.status is ChildStatus.UNDEFINED else info.status.value


def _class_name(actor: type | str) -> str:
    return actor.rsplit(":", 1)[-1] if isinstance(actor, str) else actor.__qualname__
