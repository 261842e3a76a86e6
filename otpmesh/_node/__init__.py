"""One process's endpoint: the node (incoming calls, replies), its outgoing side, actor cells
and hosts, calls and refs (``ActorRef``/``ActorMesh``), broadcast relays, link faults."""
