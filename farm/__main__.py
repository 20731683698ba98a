"""``python -m farm``: the ``farm`` command (the same as ``python -m farm_cli``).

An entry point, not part of the core library: ``import farm`` never runs this file. It hands over to the CLI, the
composition root, by module name at run time, so the core still imports no fleet package (the import rule checks
the modules a library import loads; ``__main__`` is exempt as an entry point, docs/deployment.md).
"""

import importlib

importlib.import_module("farm_cli").main(prog_name="python -m farm")
