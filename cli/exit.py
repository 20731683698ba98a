"""The ``farm`` program's exit: the command's status, without the native libraries' shutdown race.

pyarrow can abort the interpreter's shutdown (``terminate called without an active exception``, exit status -6)
when its C++ thread pools are destroyed while a worker thread of theirs is still joinable: a race in static
destructors that runs after every Python-level cleanup (apache/arrow#34314). A program that loaded pyarrow
therefore ends, once the command has returned and its output and logs are flushed, with ``os._exit``: the status
is the command's, and the destructors that race never run. Everything the farm writes is already durable by
then (archives and caches are fsynced and renamed into place, Redis transactions are acknowledged, clients
closed). In-process callers (tests invoking ``main``) are unaffected: only the program entry points use this.
"""

from __future__ import annotations

import logging
import os
import sys


def exit_status(code: object) -> int:
    """The process status of a ``SystemExit`` code (None: 0; a message: printed on stderr, 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def finish(code: object) -> None:
    """Exit with ``code``: through ``os._exit`` once pyarrow is loaded (after flushing stdout, stderr and the
    logs), else through the normal interpreter shutdown."""
    status = exit_status(code)
    if "pyarrow" not in sys.modules:
        sys.exit(status)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            status = status or 1
    os._exit(status)


def run() -> None:
    """The ``farm`` command as a program (the console script and ``python -m farm_cli``)."""
    from farm_cli import main

    try:
        main()
    except SystemExit as e:
        finish(e.code)
    finish(0)
