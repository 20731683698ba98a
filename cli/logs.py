"""Logging for the coordinator and the workers: levelled records on stderr, as text or as JSON lines.

Celery's worker logs each task's return value at INFO (about 1.5 KB a line for a group result): the farm keeps the
INFO line short (task, id, run time) and logs the result itself at DEBUG (logger ``farm.workers.results``).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (ISO 8601, UTC), level, logger, message, and the record's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key != "data" and not key.startswith("_"):
                data[key] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


class TaskResultFilter(logging.Filter):
    """Shortens Celery's task-success line and moves the return value to DEBUG."""

    results = logging.getLogger("farm.workers.results")

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and "%(return_value)s" in record.msg:
            context = record.args if isinstance(record.args, dict) else {}
            self.results.debug("Task %s[%s] returned: %s", context.get("name"), context.get("id"),
                               context.get("return_value"))
            record.msg = record.msg.replace(": %(return_value)s", "")
        return True


def setup_logging(level: str = "INFO", as_json: bool = False) -> None:
    """Configure the root logger once: a stderr handler, text or JSON lines, at ``level``."""
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    if as_json:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    trace = logging.getLogger("celery.app.trace")
    if not any(isinstance(f, TaskResultFilter) for f in trace.filters):
        trace.addFilter(TaskResultFilter())
