"""Every ```python block in README.md and docs/**/*.md runs, as a user would run it.

The convention (docs/contributing.md says the same for doc writers):

- The ```python blocks of one file form one script, run top to bottom like a notebook. The
  script is the Markdown file with every line outside a ```python block blanked, so a
  traceback's line numbers are the doc's line numbers.
- Each block stands on its own, as a reader copies it: every name it uses is defined in it
  (ruff's undefined-name check on the block alone), unless its fence says it continues the one
  before it, ```python continued: then it is checked together with the blocks it continues.
- It runs as a real program: ``python <script>`` in a subprocess, cwd = the repository root,
  the root on PYTHONPATH (``from supervisors.rl_pipeline import tree`` works), under a timeout.
  Worker processes are real, and so are the SIGKILLs.
- Nothing runs implicitly. A block that does something at run time does it under
  ``if __name__ == "__main__":`` (usually ``otpmesh.run(main)``), exactly as a saved file must:
  workers import the script to find its actor classes, so its unguarded code runs in every
  worker. A top-level ``main`` that no guard ever runs is an error (a snippet nobody runs).
- A class name is defined once per file: workers look actor classes up by name in the script,
  so a second definition would silently replace the first one's.
- A block whose first line is ``# test_<name>.py`` is a complete pytest file: it is written to a
  temporary directory under that name and run there with pytest, as a user would (repository
  root on PYTHONPATH still); it must pass, nothing skipped. It is not part of the script.
- Anything that is not meant to run (output, a log, a shell session, a signature) goes in a
  ```text (or ```bash, ...) block. ```py and ```python3 are refused: they would hide code from
  this test.

Docs written by anyone are picked up automatically, one test per file, named after it.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOC_FILES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
TIMEOUT = 120  # seconds per doc file; the slowest today takes a small fraction of it
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)(?P<info>[^\n`]*)$")
PYTEST_FILE = re.compile(r"#\s*(test_\w+\.py)\b")


@dataclass(frozen=True)
class Block:
    info: str  # the fence's info string: "python", "text", ...
    first_line: int  # 1-based line number of the block's first code line in the doc
    lines: tuple[str, ...]

    @property
    def code(self) -> str:
        return "".join(f"{line}\n" for line in self.lines)


def fenced_blocks(text: str) -> list[Block]:
    """Every fenced code block of a Markdown text, in order."""
    blocks: list[Block] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        blocks.append(Block(opening["info"].strip(), i + 2, tuple(body)))
        i = j + 1
    return blocks


def doc_id(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


#: The fence of a block that continues the one before it (its names may come from there).
CONTINUED = "continued"


@dataclass(frozen=True)
class DocProgram:
    script: str  # the doc with every non-script line blanked
    pytest_files: dict[str, str]  # name -> contents
    problems: list[str]
    # Each block as a reader copies it (with the blocks it continues), the doc's other lines
    # blanked: (line of its fence, source).
    snippets: list[tuple[int, str]]


def assemble(path: Path) -> DocProgram:
    """The script and the pytest files of one doc, and what breaks the convention."""
    text = path.read_text()
    n_lines = text.count("\n") + 1
    script = [""] * n_lines
    pytest_files: dict[str, str] = {}
    problems: list[str] = []
    snippets: list[tuple[int, str]] = []
    chain: list[str] = []
    for block in fenced_blocks(text):
        where = f"{doc_id(path)}:{block.first_line - 1}"
        if block.info in ("py", "python3") or block.info.startswith(("py ", "python3 ")):
            problems.append(f"{where}: write ```python (run by this test) or ```text, not ```py")
            continue
        if block.info.split(" ")[0] != "python":
            continue
        named = PYTEST_FILE.match(block.lines[0].strip()) if block.lines else None
        if named:
            pytest_files[named[1]] = block.code
            continue
        if CONTINUED not in block.info.split()[1:]:
            chain = [""] * n_lines
        for offset, line in enumerate(block.lines):
            script[block.first_line - 1 + offset] = line
            chain[block.first_line - 1 + offset] = line
        snippets.append((block.first_line - 1, "\n".join(chain)))
    source = "\n".join(script)
    try:
        tree = ast.parse(source, filename=doc_id(path))
    except SyntaxError as err:
        problems.append(f"{doc_id(path)}:{err.lineno}: {err.msg}")
        return DocProgram(source, pytest_files, problems, snippets)
    problems += _unrun_mains(path, tree) + _redefined_classes(path, tree)
    return DocProgram(source, pytest_files, problems, snippets)


RUFF_UNDEFINED_NAMES = [sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache"]
RUFF_UNDEFINED_NAMES += ["--select", "F821", "--output-format", "concise"]


def undefined_names(programs: dict[str, DocProgram], tmp: Path) -> list[str]:
    """The names each snippet uses and never defines (ruff's F821, one run for every doc), as
    'doc:line-of-its-fence: name, name'."""
    files: dict[str, tuple[str, int]] = {}
    for doc, program in programs.items():
        for fence, source in program.snippets:
            name = f"{doc.replace('/', '__').replace('.', '_')}__{fence}.py"
            (tmp / name).write_text(source)
            files[name] = (doc, fence)
    if not files:
        return []
    done = subprocess.run(
        [*RUFF_UNDEFINED_NAMES, str(tmp)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    # A name is blamed on the block whose line uses it (a continued block's chain repeats it).
    found: dict[tuple[str, int], set[str]] = {}
    fences = {doc: sorted(f for d, f in files.values() if d == doc) for doc, _ in files.values()}
    for line in done.stdout.splitlines():
        match = re.match(r"(?:.*/)?([^/:]+\.py):(\d+):\d+: F821 Undefined name `(.*)`", line)
        if match and match[1] in files:
            doc = files[match[1]][0]
            fence = max(f for f in fences[doc] if f < int(match[2]))
            found.setdefault((doc, fence), set()).add(match[3])
    if done.returncode not in (0, 1) or (done.returncode == 1 and not found):
        pytest.fail(f"ruff failed:\n{done.stdout}\n{done.stderr}")
    return [
        f"{doc}:{fence}: {', '.join(sorted(names))}"
        for (doc, fence), names in sorted(found.items())
    ]


def _is_main_guard(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in (
        "__name__ == '__main__'",
        "'__main__' == __name__",
    )


def _unrun_mains(path: Path, tree: ast.Module) -> list[str]:
    """A top-level ``main`` defined and never run before the next one (or the end) is dead code."""
    problems: list[str] = []
    pending: ast.stmt | None = None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "main":
            if pending is not None:
                problems.append(_never_run(path, pending))
            pending = node
        elif _is_main_guard(node) and any(
            isinstance(n, ast.Name) and n.id == "main" for n in ast.walk(node)
        ):
            pending = None
    if pending is not None:
        problems.append(_never_run(path, pending))
    return problems


def _never_run(path: Path, node: ast.stmt) -> str:
    return (
        f"{doc_id(path)}:{node.lineno}: main() is defined but never run; end the snippet with\n"
        '    if __name__ == "__main__":\n        otpmesh.run(main)'
    )


def _redefined_classes(path: Path, tree: ast.Module) -> list[str]:
    first: dict[str, int] = {}
    problems: list[str] = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        if node.name in first:
            problems.append(
                f"{doc_id(path)}:{node.lineno}: class {node.name} is already defined at line "
                f"{first[node.name]}; workers find actor classes by name in the doc's script, so "
                "give this one another name (or reuse the first)"
            )
        first.setdefault(node.name, node.lineno)
    return problems


def _env(code: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if re.search(r"^(import|from) torch\b", code, re.MULTILINE):
        # conftest.py keeps fork servers from preloading torch, for speed; code that imports
        # torch at the top is faster with the default (torch imported once, before the forks).
        env.pop("OTPMESH_PRELOAD", None)
    return env


def _run(
    argv: list[str], code: str, what: str, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            argv, cwd=cwd, env=_env(code), capture_output=True, text=True, timeout=TIMEOUT
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{what} did not finish within {TIMEOUT} s; output so far:\n{exc.stdout!r}")
    return done


@pytest.mark.parametrize("path", DOC_FILES, ids=doc_id)
def test_doc_snippets_run(path: Path, tmp_path: Path) -> None:
    program = assemble(path)
    assert not program.problems, "\n".join(program.problems)
    if program.script.strip():
        # Named after the doc, so a traceback says which one; its line numbers are the doc's.
        script = tmp_path / (doc_id(path).replace("/", "__").replace(".", "_") + ".py")
        script.write_text(program.script)
        done = _run([sys.executable, str(script)], program.script, doc_id(path))
        assert done.returncode == 0, (
            f"the python blocks of {doc_id(path)} failed (exit {done.returncode}); line numbers "
            f"below are the doc's\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        )
    if program.pytest_files:
        for name, contents in program.pytest_files.items():
            (tmp_path / name).write_text(contents)
        names = sorted(program.pytest_files)
        done = _run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *names],
            "\n".join(program.pytest_files.values()),
            f"{doc_id(path)}: {', '.join(names)}",
            cwd=tmp_path,
        )
        summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        assert done.returncode == 0 and "skipped" not in summary, (
            f"{doc_id(path)}: the test files {names} did not pass\n{done.stdout}\n{done.stderr}"
        )


def test_each_snippet_stands_on_its_own_or_says_it_continues(tmp_path: Path) -> None:
    programs = {doc_id(path): assemble(path) for path in DOC_FILES}
    found = undefined_names(programs, tmp_path)
    assert not found, (
        "these blocks (doc:line of the fence) use names they never define, so one copied alone "
        "fails with a NameError: import or define them in the block, or, if it continues the "
        f"block before it, open it with ```python {CONTINUED}\n" + "\n".join(found)
    )


# ---- the harness itself ------------------------------------------------------------------------


def test_the_script_keeps_the_docs_line_numbers(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Title\n\n```python\nx = 1\n```\n\ntext\n\n```text\nnot code\n```\n\n"
        "```python\nraise ValueError(x)\n```\n"
    )
    program = assemble(doc)
    lines = program.script.split("\n")
    assert lines[3] == "x = 1" and lines[13] == "raise ValueError(x)"
    assert "not code" not in program.script and not program.problems


def test_a_main_that_is_never_run_is_reported(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "```python\nasync def main() -> None:\n    pass\n```\n\n"
        '```python\nasync def main() -> None:\n    pass\n\nif __name__ == "__main__":\n'
        "    otpmesh.run(main)\n```\n"
    )
    (problem,) = assemble(doc).problems
    assert ":2: main() is defined but never run" in problem


def test_redefined_classes_and_py_fences_are_reported(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "```python\nclass A: ...\n```\n```python\nclass A: ...\n```\n```py\nhidden()\n```\n"
    )
    problems = assemble(doc).problems
    assert any("write ```python" in p for p in problems)
    assert any(":5: class A is already defined at line 2" in p for p in problems)


def test_pytest_files_are_set_apart(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("```python\n# test_mine.py: a test file\ndef test_x() -> None: ...\n```\n")
    program = assemble(doc)
    assert list(program.pytest_files) == ["test_mine.py"] and not program.script.strip()


if __name__ == "__main__":
    # python tests/test_docs.py docs/tutorial.md > script.py: the script the test runs, to debug.
    print(assemble(Path(sys.argv[1])).script)


def test_a_block_that_uses_an_earlier_blocks_names_must_say_it_continues(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        f"```python\nimport otpmesh\n```\n\n```python {CONTINUED}\nprint(otpmesh)\n```\n\n"
        "```python\nprint(otpmesh)\n```\n"
    )
    found = undefined_names({"doc.md": assemble(doc)}, tmp_path)
    assert found == ["doc.md:9: otpmesh"]
