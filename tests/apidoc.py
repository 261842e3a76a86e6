"""Generate docs/api.md from the docstrings of otpmesh's public API.

    python tests/apidoc.py            # rewrite docs/api.md
    python tests/apidoc.py --check    # exit 1 if docs/api.md is out of date

The public names are the curated re-exports (``from ._x import name as name``) of
``otpmesh/__init__.py``, ``otpmesh/rdma/__init__.py`` and ``otpmesh/testing/__init__.py``
(and ``otpmesh.monarch.__all__``)
(those needing hypothesis included), ``otpmesh.chaos.__all__``, and the public classes and
functions of ``otpmesh.launchers``. tests/test_apidoc.py fails
when the committed page differs from what this script writes, and when a public name has no
documentation: a docstring for classes and functions, the enum's docstring for enum members, a
``#:`` comment above the assignment for other constants. Type aliases may go without one: their
definition is shown.

This lives in tests/ (not otpmesh/) because it is a maintenance tool, not part of the library.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import importlib.util
import inspect
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
API_MD = REPO / "docs" / "api.md"
COMMAND = "python tests/apidoc.py"

MODULES = (
    "otpmesh",
    "otpmesh.chaos",
    "otpmesh.launchers",
    "otpmesh.monarch",
    "otpmesh.rdma",
    "otpmesh.testing",
)

# Sections of the otpmesh page, in order; an exported name in none of them goes to "Other".
GROUPS: dict[str, tuple[str, ...]] = {
    "Actors and meshes": (
        "Actor", "endpoint", "context", "ActorContext", "proc_mesh", "ProcMesh", "ActorMesh",
        "ActorRef", "Endpoint", "ValueMesh", "retry", "run",
    ),
    "Supervision trees": (
        "Supervisor", "Worker", "Mesh", "start", "App", "start_background", "BackgroundApp",
        "ONE_FOR_ONE", "ONE_FOR_ALL",
        "ALL_FOR_ONE", "REST_FOR_ONE", "ESCALATE", "PERMANENT", "TRANSIENT", "TEMPORARY",
        "BRUTAL_KILL", "INFINITY", "NEVER", "ANY_SIGNIFICANT", "ALL_SIGNIFICANT", "Outcome",
    ),
    "The event log": ("EventLog", "LogEntry", "LogKind"),
    "Exits": ("ActorCrash", "ProcessExit", "Ignore", "describe"),
    "Several hosts": ("cluster", "Cluster"),
    "Errors": (
        "OtpmeshError", "ActorError", "ActorDiedError", "CallTimeoutError", "ChildError",
        "EncodeError", "MeshError", "ProtocolError", "SpawnError", "SpecError", "SupervisorError",
        "AppStoppedError",
    ),
}  # fmt: skip

# Public-looking members that are runtime plumbing, not API: left out of the page.
INTERNAL_MEMBERS = {
    "App": {
        "actor_exited", "actor_exiting", "fail_next_starts", "failure", "incarnations",
        "injected_start_failure", "last_exit", "reply", "resolve", "root_exited", "slot",
        "slots_under", "watch", "work_done", "work_started",
    },
    "Cluster": {"connection_lost", "declare_dead", "kill", "on_agent_hello", "spawn", "watch"},
    "EventLog": {"append", "close"},
    "SupervisionMachine": {"teardown"},
}  # fmt: skip

# Classes users get from otpmesh and never construct: their constructor is not API.
MADE_BY_OTPMESH = {
    "App", "ProcMesh", "ActorMesh", "ActorRef", "Endpoint", "ValueMesh", "EventLog", "Cluster",
    "BackgroundApp",
}  # fmt: skip


@dataclass(frozen=True)
class Name:
    module: str  # where users import it from: "otpmesh", "otpmesh.chaos", ...
    name: str
    obj: Any
    source: str  # the module that defines it (for #: comments)


def public_names(module_name: str) -> list[Name]:
    """The curated exports of one module, in source order (modules themselves left out): its
    ``__all__``; else its ``from .x import name as name`` re-exports and the public classes and
    functions it defines itself."""
    module = importlib.import_module(module_name)
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text())
    if hasattr(module, "__all__"):  # a name imported from a submodule is documented there
        sources = {
            alias.name: importlib.util.resolve_name(
                "." * node.level + (node.module or ""), module_name
            )
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.level
            for alias in node.names
        }
        return [
            Name(module_name, n, getattr(module, n), sources.get(n, module_name))
            for n in module.__all__
        ]
    names: list[Name] = []
    seen: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            if node in tree.body and not node.name.startswith("_"):
                names.append(Name(module_name, node.name, getattr(module, node.name), module_name))
            continue
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        for alias in node.names:
            if alias.asname != alias.name or alias.name in seen:
                continue  # only `import x as x` re-exports are public (trio's convention)
            obj = getattr(module, alias.name)
            if isinstance(obj, types.ModuleType):
                continue
            seen.add(alias.name)
            source = importlib.util.resolve_name(
                "." * node.level + (node.module or ""), module_name
            )
            names.append(Name(module_name, alias.name, obj, source))
    return names


def _comment_doc(source_module: str, name: str) -> str:
    """The ``#:`` comment lines right above ``name = ...`` in its defining module."""
    path = importlib.import_module(source_module).__file__
    assert path is not None
    lines = Path(path).read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(rf"{re.escape(name)}\s*(:[^=]*)?=", line):
            doc: list[str] = []
            for above in reversed(lines[:i]):
                if not above.startswith("#:"):
                    break
                doc.insert(0, above[2:].strip())
            return " ".join(doc)
    return ""


def is_type_alias(obj: Any) -> bool:
    return isinstance(obj, types.GenericAlias | types.UnionType) or type(obj).__module__ == "typing"


def _alias_source(source_module: str, name: str) -> str:
    """A type alias as written in its defining module (``A | B``, not the resolved repr)."""
    path = importlib.import_module(source_module).__file__
    assert path is not None
    for node in ast.parse(Path(path).read_text()).body:
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == name and node.value:
            return ast.unparse(node.value)
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [name]:
            return ast.unparse(node.value)
    return _annotation(name)


def documentation(item: Name) -> str:
    """What documents a public name; empty when nothing does."""
    obj = item.obj
    if isinstance(obj, enum.Enum):
        return inspect.cleandoc(type(obj).__doc__ or "")
    if inspect.isclass(obj) or inspect.isroutine(obj):
        return inspect.cleandoc(obj.__doc__ or "")
    return _comment_doc(item.source, item.name)


# ---- rendering ---------------------------------------------------------------------------------


def _value(value: Any) -> str:
    """A default value as users would write it; never an address."""
    if isinstance(value, enum.Enum):
        return value.name
    if value == sys.executable:
        return "sys.executable"  # this machine's path would make the page differ on each
    if inspect.isclass(value):
        return value.__name__
    if isinstance(value, tuple):
        inner = ", ".join(_value(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    text = repr(value)
    if re.search(r" at 0x[0-9a-f]+", text):
        raise ValueError(f"default {text} has no stable text; give it a repr")
    return text


def _annotation(annotation: Any) -> str:
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    return re.sub(r"ForwardRef\('([^']*)'\)", r"\1", text)


def signature(obj: Any, name: str, *, wrap: bool = True) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return ""
    params: list[str] = []
    star_done = False
    for p in sig.parameters.values():
        if p.name in ("self", "cls") or p.name.startswith("_"):
            continue
        if p.kind is p.KEYWORD_ONLY and not star_done:
            params.append("*")
        star_done = star_done or p.kind in (p.KEYWORD_ONLY, p.VAR_POSITIONAL)
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        text = prefix + p.name
        if p.annotation is not p.empty:
            text += f": {_annotation(p.annotation)}"
        default = p.default
        field = getattr(obj, "__dataclass_fields__", {}).get(p.name)
        if field is not None and field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()  # show {'procs': 1}, not <factory>
        if p.default is not p.empty:
            spaced = p.annotation is not p.empty  # PEP 8: `x: int = 1`, but `x=1`
            text += f" = {_value(default)}" if spaced else f"={_value(default)}"
        params.append(text)
        if p.kind is p.POSITIONAL_ONLY:
            params.append("/")
    ret = ""
    if sig.return_annotation is not sig.empty and not inspect.isclass(obj):
        ret = f" -> {_annotation(sig.return_annotation)}"
    wrapped = getattr(obj, "__wrapped__", None)
    if wrapped is not None and inspect.isasyncgenfunction(wrapped):
        ret = re.sub(r"AsyncIterator\[(.*)\]$", r"AbstractAsyncContextManager[\1]", ret)
    prefix = "async def " if inspect.iscoroutinefunction(obj) else ""
    one_line = f"{prefix}{name}({', '.join(params)}){ret}"
    if not wrap or len(one_line) <= 100 or not params:
        return one_line
    return f"{prefix}{name}(\n" + "".join(f"    {p},\n" for p in params) + f"){ret}"


def _anchor(title: str) -> str:
    """GitHub's heading anchor."""
    slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
    return slug


def _members(cls: type, cls_name: str) -> list[str]:
    out: list[str] = []
    hidden = INTERNAL_MEMBERS.get(cls_name, set())
    for member_name, member in vars(cls).items():
        if member_name.startswith("_") or member_name in hidden:
            continue
        if isinstance(member, property):
            doc = inspect.cleandoc(member.__doc__ or "")
            out.append(f"- `{member_name}` (property){': ' + doc if doc else ''}")
        elif isinstance(member, classmethod | staticmethod):
            func = member.__func__
            out.append(_member_line(signature(func, member_name, wrap=False), func.__doc__))
        elif inspect.isfunction(member):
            out.append(_member_line(signature(member, member_name, wrap=False), member.__doc__))
        elif not (
            type(member).__name__ == "member_descriptor"  # a slots field: in the signature
            or member_name in getattr(cls, "__dataclass_fields__", {})
        ):
            out.append(f"- `{member_name} = {_value(member)}` (class attribute)")
    return out


def _member_line(sig: str, doc: str | None) -> str:
    text = inspect.cleandoc(doc or "")
    if not text:
        return f"- `{sig}`"
    indented = text.replace("\n", "\n  ")
    return f"- `{sig}`: {indented}"


def render_name(item: Name, level: str = "###") -> str:
    obj = item.obj
    parts = [f"{level} `{item.module}.{item.name}`", ""]
    if inspect.isclass(obj) and issubclass(obj, enum.Enum):
        values = ", ".join(f"`{m.name}` (`{m.value!r}`)" for m in obj)
        parts += [f"`class {item.name}({obj.__mro__[1].__name__})`: {values}", ""]
    elif inspect.isclass(obj) or inspect.isroutine(obj):
        sig = signature(obj, item.name)
        if inspect.isclass(obj):
            bases = ", ".join(
                b.__name__
                for b in obj.__bases__
                if b is not object and b.__name__ != "Generic" and not b.__name__.startswith("_")
            )
            if item.name in MADE_BY_OTPMESH or getattr(obj, "_is_protocol", False):
                sig = item.name  # made by otpmesh (or a Protocol): its constructor is no API
            head = f"class {sig or item.name}" + (f"  # bases: {bases}" if bases else "")
        else:
            head = sig
        parts += ["```text", head, "```", ""]
    elif is_type_alias(obj):
        parts += [f"Type alias: `{item.name} = {_alias_source(item.source, item.name)}`", ""]
    else:
        parts += [f"`{item.name} = {_value(obj)}`", ""]
    doc = documentation(item)
    if doc:
        parts += [doc, ""]
    if inspect.isclass(obj) and not issubclass(obj, enum.Enum):
        members = _members(obj, item.name)
        if members:
            parts += [*members, ""]
    return "\n".join(parts)


def render_constants(items: list[Name], level: str) -> str:
    """Members of one enum exported as constants: one entry, the enum's docstring once."""
    kind = type(items[0].obj)
    names = ", ".join(f"`{i.name}`" for i in items)
    lines = [f"{level} {names}", ""]
    for i in items:
        same = "" if i.name == i.obj.name else f", the same member as `{i.obj.name}`"
        lines.append(
            f"- `{i.module}.{i.name}`: `{kind.__name__}.{i.obj.name}` (`{i.obj.value!r}`{same})"
        )
    return "\n".join([*lines, "", documentation(items[0]), ""])


def render_all(items: list[Name], level: str) -> list[str]:
    """Render in order, consecutive members of one enum together."""
    out: list[str] = []
    i = 0
    while i < len(items):
        obj = items[i].obj
        if isinstance(obj, enum.Enum):
            j = i
            while j < len(items) and type(items[j].obj) is type(obj):
                j += 1
            out.append(render_constants(items[i:j], level))
            i = j
        else:
            out.append(render_name(items[i], level))
            i += 1
    return out


def _grouped(names: list[Name]) -> list[tuple[str, list[Name]]]:
    by_name = {n.name: n for n in names}
    groups = [
        (title, [by_name[n] for n in members if n in by_name]) for title, members in GROUPS.items()
    ]
    grouped = {n for _, members in GROUPS.items() for n in members}
    other = [n for n in names if n.name not in grouped]
    return [g for g in groups if g[1]] + ([("Other", other)] if other else [])


def generate() -> str:
    header = [
        "# API reference",
        "",
        f"Generated from the docstrings by `{COMMAND}`; `tests/test_apidoc.py` fails when this",
        "page and the code disagree, so do not edit it by hand: fix the docstring and run the",
        "command. For the concepts, start with the [tutorial](tutorial.md).",
        "",
    ]
    toc: list[str] = []
    body: list[str] = []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        names = public_names(module_name)
        toc.append(f"- [`{module_name}`](#{_anchor(module_name)})")
        body += [f"## {module_name}", "", inspect.cleandoc(module.__doc__ or ""), ""]
        sections = _grouped(names) if module_name == "otpmesh" else [("", names)]
        for title, items in sections:
            if title:
                toc.append(f"  - [{title}](#{_anchor(title)})")
                body += [f"### {title}", ""]
            level = "####" if title else "###"
            body += render_all(items, level)
    text = re.sub(r"\n{3,}", "\n\n", "\n".join([*header, *toc, "", *body])).rstrip() + "\n"
    if str(REPO) in text:
        raise ValueError(f"the page would hold this checkout's path {REPO}: give it a stable text")
    return text


def main(argv: list[str]) -> int:
    text = generate()
    if "--check" in argv:
        if API_MD.read_text() != text:
            print(f"docs/api.md is out of date: run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    API_MD.write_text(text)
    print(f"wrote {API_MD.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
