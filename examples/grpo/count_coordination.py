"""Count the coordination code of the two GRPO versions and print a table.

    python examples/grpo/count_coordination.py [--show]

The code is marked by hand with comment lines, ``# <kind>: begin`` ... ``# <kind>: end``:

- ``coordination``: code that exists because the work is spread over processes: giving each
  process its role, moving weights, batches and rewards between them, and the per-iteration
  loop that drives it (the SPMD ranks' role functions; otpmesh's actor classes, tree and calls);
- ``recovery``: code that exists to survive faults (checkpoints, idempotent steps, retries);
  only otpmesh has any;
- ``launch``: starting the processes yourself when torchrun did not (SPMD only; otpmesh starts
  its processes inside ``otpmesh.start``, counted as coordination).

A region may sit inside another; its lines count for the innermost one. Blank lines, comments and
docstrings are not counted. Not marked, in either version: the shared task (``task.py``: model,
sampling, reward, GRPO loss and update), argument parsing, printing and plotting, and the fault
plan (it is the experiment, not the program).
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent
VERSIONS = {
    "otpmesh": [EXAMPLES / "grpo" / "actors.py", EXAMPLES / "grpo" / "train.py"],
    "spmd": [EXAMPLES / "grpo_spmd.py"],
}
KINDS = ("coordination", "recovery", "launch")
MARKER = re.compile(r"^\s*# (coordination|recovery|launch): (begin|end)\s*$")


def docstring_lines(source: str) -> set[int]:
    """The line numbers (1-based) of every docstring in `source`."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                lines.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    return lines


def classify(path: Path) -> dict[str, list[str]]:
    """The counted lines of `path`, by kind (the innermost open region wins)."""
    source = path.read_text()
    skip = docstring_lines(source)
    found: dict[str, list[str]] = {kind: [] for kind in KINDS}
    open_regions: list[str] = []
    for number, line in enumerate(source.splitlines(), start=1):
        marker = MARKER.match(line)
        if marker:
            kind, edge = marker.groups()
            if edge == "begin":
                open_regions.append(kind)
            elif not open_regions or open_regions.pop() != kind:
                raise ValueError(f"{path}:{number}: '# {kind}: end' closes no '{kind}' region")
            continue
        code = line.strip()
        if open_regions and code and not code.startswith("#") and number not in skip:
            found[open_regions[-1]].append(f"{path.name}:{number}: {line}")
    if open_regions:
        raise ValueError(f"{path}: region '{open_regions[-1]}' never ends")
    return found


def count() -> dict[str, dict[str, list[str]]]:
    """Per version, per kind, the counted lines of all its files."""
    totals: dict[str, dict[str, list[str]]] = {}
    for version, paths in VERSIONS.items():
        totals[version] = {kind: [] for kind in KINDS}
        for path in paths:
            for kind, lines in classify(path).items():
                totals[version][kind] += lines
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", action="store_true", help="print the counted lines too")
    args = parser.parse_args()
    totals = count()
    print(f"{'version':<10}" + "".join(f"{kind:>14}" for kind in KINDS) + f"{'total':>8}")
    for version, kinds in totals.items():
        sizes = [len(kinds[kind]) for kind in KINDS]
        print(f"{version:<10}" + "".join(f"{n:>14}" for n in sizes) + f"{sum(sizes):>8}")
    if args.show:
        for version, kinds in totals.items():
            for kind in KINDS:
                print(f"\n== {version}: {kind}")
                print("\n".join(kinds[kind]))


if __name__ == "__main__":
    main()
