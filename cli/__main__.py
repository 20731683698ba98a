"""``python -m farm_cli``: the ``farm`` command."""

from farm_cli.exit import run

if __name__ == "__main__":  # not when a spawned process pool worker (farm compile) imports this module
    run()
