"""The controller: ``otpmesh.start`` and the ``App`` façade, the supervision drivers around the
pure core, placement of actors on processes, proc meshes, the event log."""
