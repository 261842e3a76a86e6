"""Ready-made supervision trees for common ML workloads: import them, or copy one and edit it.

Each module holds toy CPU-only actors standing in for the real ones, a module-level ``tree`` (a
spec: importing it starts nothing), a ``make_tree(**options)`` to build variants, and a runnable
demo that crashes an actor on purpose and prints the supervision events::

    python supervisors/rl_pipeline.py [--local]

- ``rl_pipeline``: REST_FOR_ONE over learner, reward model and a ONE_FOR_ONE rollout mesh.
- ``data_parallel``: an ALL_FOR_ONE mesh of trainers (DDP/FSDP: one failure restarts the group).
- ``pipeline_stages``: REST_FOR_ONE over stages (a failed stage restarts with the later ones).
- ``serving_replicas``: a ONE_FOR_ONE mesh of independent replicas with a higher intensity.

The modules are self-contained on purpose, so one can be copied alone; that is why the small
demo helpers (``fault``, ``print_events``) are repeated in each. A tree built from these classes
runs in worker processes too: the workers import the module by name, so keep your copy
importable (on ``sys.path``) or run it as a script, as above. ``docs/supervision.md`` explains
every strategy and option used here.
"""
