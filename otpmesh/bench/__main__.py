"""``python -m otpmesh.bench [SUITE] [options]``: run one benchmark suite, the call suite
(``core``) when none is named; the options after the suite's name are the suite's own."""

from __future__ import annotations

import importlib
import sys

#: Every suite: its name on the command line (and its module's in this package), what it measures.
SUITES = {
    "core": "calls, broadcasts, pipelining and restarts beside a bare trio echo (the default)",
    "hangs": "progress deadlines to the restarted actor's reply, and app.stacks()",
    "shutdown": "stopping actors stuck in plain-def endpoints: a Mesh and a supervisor",
    "monarch": "calls through otpmesh.monarch beside the native API",
    "sync": ".get() from a plain script beside await",
    "scale": "what idle workers cost and how fast many start",
    "instructions": "instructions per round trip on each side, counted by callgrind",
    "owned": "actors that own meshes: start, restart of a nested replica, lookup",
    "heal": "a SIGKILLed replica healed from a peer beside restored from a checkpoint",
    "pgroup": "a gloo process group re-formed after a member's SIGKILL",
    "hosts": "broadcasts to meshes on 1 to 3 hosts, relayed by agents or direct",
    "rdma": "tensor-channel transfer speed beside copy_, clone and gloo",
    "takeover": "a standby controller taking the tree over after a SIGKILL",
    "flood": "floods of connections and half-sent frames on every open port",
    "rl": "the GRPO example job: iterations, weight sync, restarts (from the checkout)",
    "serving": "the serving recipe with a replica SIGKILLed mid-stream (from the checkout)",
}

#: The older spellings, flags of the call suite's: ``--monarch`` runs the ``monarch`` suite.
FLAGS = {"--monarch": "monarch", "--hangs": "hangs", "--shutdown": "shutdown"}

EPILOG = (
    "suites (python -m otpmesh.bench SUITE --help for a suite's options):\n"
    + "".join(f"  {name:<13} {what}\n" for name, what in SUITES.items())
    + "\n--monarch, --hangs and --shutdown are the older spellings of those suites."
)


def suite_of(argv: list[str]) -> tuple[str, list[str]]:
    """(the suite to run, its own arguments) from the command line's arguments."""
    if argv and not argv[0].startswith("-"):
        if argv[0] not in SUITES:
            raise SystemExit(
                f"python -m otpmesh.bench: no suite {argv[0]!r}; the suites are "
                f"{', '.join(SUITES)} (python -m otpmesh.bench --help says what each measures)"
            )
        return argv[0], argv[1:]
    for flag, suite in FLAGS.items():
        if flag in argv:
            return suite, [arg for arg in argv if arg != flag]
    return "core", argv


def main(argv: list[str] | None = None) -> None:
    suite, rest = suite_of(sys.argv[1:] if argv is None else argv)
    module = importlib.import_module(f"otpmesh.bench.{suite}")
    if suite == "core":
        module.main(rest, epilog=EPILOG)
    else:
        module.main(rest)


if __name__ == "__main__":
    main()
