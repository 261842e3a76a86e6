"""Processes: the controller's runtime (its node, fork server and workers), the worker process,
the fork server and its client, ``otpmesh.run``."""
