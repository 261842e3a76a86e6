"""The host agent's command line (``otpmesh agent``, ``python -m otpmesh._hosts._agent``)."""

from __future__ import annotations

import argparse

DESCRIPTION = (
    "The host agent: one per host, dials the controller and forks that host's worker processes."
)


def parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="otpmesh agent", description=DESCRIPTION)
    p.add_argument(
        "--controller",
        required=True,
        help="the controller, tcp:HOST:PORT; with a takeover across hosts, every controller's "
        "address, comma-separated: tried in turn when the one served is lost",
    )
    p.add_argument(
        "--listen",
        help="the address this host's workers listen on (default: the "
        "address this host reaches the controller from)",
    )
    p.add_argument("--rank", type=int, help="this host's index in the mesh's hosts dimension")
    p.add_argument(
        "--rank-from-env",
        metavar="VAR",
        help="take the rank from this environment variable (SLURM_NODEID, GROUP_RANK)",
    )
    p.add_argument("--name", help="this host's name in logs and exit reasons (default: hostname)")
    p.add_argument(
        "--secret-stdin",
        action="store_true",
        help="read the secret from the first line of stdin; exit when stdin closes",
    )
    p.add_argument(
        "--token-stdin",
        action="store_true",
        help="read a one-time registration token from the line of stdin after the secret "
        "(launchers give one to each agent they start: only that agent may register as its rank)",
    )
    p.add_argument(
        "--reconnect",
        type=float,
        default=60.0,
        help="seconds to keep trying to register again after losing the controller",
    )
    p.add_argument(
        "--ignore-sigterm",
        action="store_true",
        help="ignore SIGTERM, and so do the workers (Slurm sends it to every process of a job "
        "that ends, the controller included, which then stops the tree within the grace)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log registrations and spawns")
    return p
