"""``python -m farm_cli``: the ``farm`` command."""

from farm_cli import main

main()
