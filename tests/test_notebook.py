"""Programs without a main file: a notebook run by a real Jupyter kernel, and ``python -c``.

Their actor classes reach the workers as definitions (otpmesh/_node/_mainmodule.py); a notebook
drives its app from the kernel's asyncio loop with ``otpmesh.start_background``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from otpmesh._core._errors import SpawnError
from otpmesh._node._mainmodule import MainModule, _definitions, main_class
from tests.conftest import alive

ROOT = Path(__file__).parent.parent

ACTOR = """\
import os, signal
import otpmesh
from otpmesh import Actor, endpoint

PREFIX = "hello"

def greeting(who):
    return f"{PREFIX} {who}"

class Greeter(Actor):
    @endpoint
    async def hello(self, who):
        return greeting(who), os.getpid(), otpmesh.context().path
"""

CELLS = [
    ACTOR,
    "data = [1, 2, 3]  # a cell's work: not run in the workers\n"
    'tree = otpmesh.Supervisor("nb", children=[otpmesh.Worker("greeter", Greeter)])\n'
    "app = await otpmesh.start_background(tree)",
    'first = await app.actor("nb/greeter").hello("cell")\nprint("first", first)',
    'print("got", app.actor("nb/greeter").hello("sync").get()[0])  # a blocking cell',
    "os.kill(first[1], signal.SIGKILL)\n"
    'second = await app.run(otpmesh.retry, app.actor("nb/greeter").hello, "again")\n'
    'print("second", second, second[1] != first[1])',
    "await app.stop()\nprint('stopped', app.running)",
]


@pytest.mark.timeout(60)
def test_a_notebook_defines_an_actor_in_a_cell_survives_a_sigkill_and_stops() -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(cell) for cell in CELLS]
    client = nbclient.NotebookClient(
        notebook, timeout=30, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    )
    client.execute()
    out = "".join(
        output.get("text", "") for cell in notebook.cells for output in cell.get("outputs", [])
    )
    lines = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    first = ast.literal_eval(lines["first"])
    assert first[0] == "hello cell" and first[2] == "nb/greeter"
    assert lines["got"] == "hello sync"
    second, moved = lines["second"].rsplit(" ", 1)
    assert ast.literal_eval(second)[0] == "hello again" and moved == "True"
    assert lines["stopped"] == "False"
    assert not alive(first[1]) and not alive(ast.literal_eval(second)[1])


PROGRAM = (
    ACTOR
    + """
async def main():
    tree = otpmesh.Supervisor("c", children=[otpmesh.Worker("greeter", Greeter)])
    async with otpmesh.start(tree) as app:
        ref = app.actor("c/greeter")
        first = await ref.hello("dash-c")
        os.kill(first[1], signal.SIGKILL)
        second = await otpmesh.retry(ref.hello, "again")
        print(first[0], second[0], first[1] != second[1], second[1])

otpmesh.run(main)
"""
)


@pytest.mark.timeout(60)
def test_python_dash_c_runs_actors_defined_in_its_code() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=50, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    assert words[:5] == ["hello", "dash-c", "hello", "again", "True"]
    assert not alive(int(words[5]))


def test_standard_input_says_where_to_put_the_class() -> None:
    with pytest.raises(SpawnError, match=r"read from standard input .* python -c"):
        main_class(MainModule(), "__main__:Greeter", "Greeter")


def test_definitions_keep_imports_defs_classes_and_literals_at_their_lines() -> None:
    cell = textwrap.dedent(
        """\
        import os
        N = 4
        model = load()            # work: blanked
        @decorate
        class A:
            x = N

        if __name__ == "__main__":
            run()
        """
    )
    [(name, kept)] = _definitions([("<cell 1>", cell)])
    lines = kept.splitlines()
    assert name == "<cell 1>"
    assert lines[0] == "import os" and lines[1] == "N = 4" and lines[2] == ""
    assert lines[3:6] == ["@decorate", "class A:", "    x = N"]
    assert "run()" not in kept and "load()" not in kept


def test_a_name_defined_again_is_kept_where_last_defined_an_import_where_first() -> None:
    chunks = _definitions(
        [
            ("<cell 1>", "import os\nclass A:\n    v = 1\n"),
            ("<cell 2>", "import os\nclass A:\n    v = 2\n"),
        ]
    )
    assert chunks == (("<cell 1>", "import os\n"), ("<cell 2>", "\nclass A:\n    v = 2\n"))


def test_a_definition_that_fails_in_the_worker_is_named_when_the_class_is_missing() -> None:
    sys.modules.pop("__otpmesh_main__", None)
    main = MainModule(chunks=(("<cell 1>", "import not_a_module_here\nclass B:\n    pass\n"),))
    try:
        with pytest.raises(SpawnError, match=r"define no Greeter.*line 1: ModuleNotFoundError"):
            main_class(main, "__main__:Greeter", "Greeter")
    finally:
        sys.modules.pop("__otpmesh_main__", None)
