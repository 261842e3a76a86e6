"""Hosts past this one: the host agent and the controller's side of a cluster (launchers are
the public ``otpmesh.launchers``)."""
