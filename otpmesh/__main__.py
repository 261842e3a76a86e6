"""``python -m otpmesh``: the ``otpmesh`` command."""

from ._cli._cli import main

if __name__ == "__main__":
    main()
