"""The ``otpmesh`` command: run (live tree view), events (timeline), bench, agent."""
