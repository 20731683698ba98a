"""``python -m farm``: the ``farm`` command (the same as ``python -m farm_cli``).

An entry point, exempt from the core's import rule: it hands over to the CLI by name (docs/deployment.md).
"""

import importlib

importlib.import_module("farm_cli").main(prog_name="python -m farm")
