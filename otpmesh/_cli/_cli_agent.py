"""``otpmesh agent --controller tcp:HOST:PORT``: run this host's agent (docs/multihost.md)."""

from __future__ import annotations

import argparse
from typing import Any

from .._hosts import _agent

DESCRIPTION = """\
Run this host's otpmesh agent: dial the controller, authenticate with the
cluster secret, and fork this host's worker processes on its request. A
launcher (otpmesh.launchers: Local, SSH, Slurm) starts it for you; run it by
hand for a Static cluster (Kubernetes pods, a torchrun job).

The secret: --secret-stdin, else $OTPMESH_SECRET, else the file
$OTPMESH_SECRET_FILE, else ~/.otpmesh/secret (mode 0600).
"""

EXAMPLES = """\
examples:
  otpmesh agent --controller tcp:10.0.0.5:7370
  otpmesh agent --controller tcp:ctl.ml.svc:7370 --rank-from-env POD_INDEX
"""


def add_to(commands: Any) -> None:
    parser = commands.add_parser(
        "agent",
        help="run this host's agent for a multi-host controller",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _agent.parser(parser)
    parser.set_defaults(handler=_agent.run_agent)
