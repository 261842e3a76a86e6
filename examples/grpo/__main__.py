"""``python -m examples.grpo``: train (see ``train.py``)."""

from .train import cli

if __name__ == "__main__":
    cli()
