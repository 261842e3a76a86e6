"""GRPO on a toy task, twice: with otpmesh actors (``python -m examples.grpo``) and as an SPMD
torch.distributed program (``python examples/grpo_spmd.py``), sharing ``task.py``."""
