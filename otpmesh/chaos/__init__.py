"""Fault injection for running applications: kill actors on purpose and watch the tree recover.

Every function takes the running ``App`` and the path of an actor in it. Each injected fault is
recorded in ``app.events`` (kind ``fault_injected``) right beside the supervision steps it causes.

    await chaos.crash(app, "rl/rollouts/2")           # an exception inside the actor, now
    await chaos.stop(app, "rl/reward", "shutdown")    # it exits 'normal' / 'shutdown' / (...)
    await chaos.kill(app, "rl/learner")               # SIGKILL its process
    await chaos.kill(app, "rl/scoring")               # a supervisor: all under it at once
    await chaos.hang(app, "rl/rollouts/0")            # SIGSTOP it: heartbeats stop, it is replaced
    await chaos.partition(app, "rl/rollouts/1", 2.0)  # its messages are lost for 2 s
    await chaos.delay(app, "rl/learner", 0.05, 5.0)   # messages to it arrive 50 ms late for 5 s
    chaos.fail_starts(app, "rl/reward", 2)            # its next 2 starts fail
    await chaos.kill_controller(app)                  # SIGKILL this controller: a standby
                                                      # takes over (needs takeover=...)

Two ways to throw faults by the dozen, both reproducible from a seed:

- ``FaultPlan``: faults at *steps* of your own loop (iteration 3: kill the learner). The same plan
  injects the same faults at the same points on any machine, however fast it runs: use it in
  tests and examples whose assertions count faults and restarts. A plan can kill the
  controller too (``controller_kills=``, kind ``"controller"``) when the app runs with a
  takeover: the standby's driver, resuming at that step, finds the kill journalled and goes on.
- ``ChaosMonkey``: faults at random *times* in the background (a rate per second), for soak runs
  and for calls that must keep being answered whatever the timing.
"""

from ._faults import (
    FAULTS,
    Fault,
    crash,
    delay,
    drop,
    fail_starts,
    hang,
    kill,
    kill_controller,
    partition,
    stop,
    wedge,
)
from ._monkey import ChaosMonkey
from ._plan import FaultPlan, PlannedFault

__all__ = [
    "FAULTS",
    "ChaosMonkey",
    "Fault",
    "FaultPlan",
    "PlannedFault",
    "crash",
    "delay",
    "drop",
    "fail_starts",
    "hang",
    "kill",
    "kill_controller",
    "partition",
    "stop",
    "wedge",
]
