"""``python -m farm_cli``: the ``farm`` command."""

from farm_cli.exit import run

run()
