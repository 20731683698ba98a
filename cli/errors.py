"""How the ``farm`` command fails: one line on stderr that says what to do, and the exit status of STYLE.md.

0 all done; 1 some problems failed; 2 bad usage or configuration (and unreachable servers); 130 on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from urllib.parse import urlsplit

import click

from farm.errors import FarmError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

BROKER_SCHEMES = ("redis", "rediss", "amqp", "amqps", "pyamqp")
REDIS_SCHEMES = ("redis", "rediss", "unix")


def fail(message: str, status: int = EXIT_USAGE) -> None:
    """Print ``farm: error: message`` on stderr and exit."""
    click.echo(f"farm: error: {message}", err=True)
    sys.exit(status)


def check_url(url: str | None, what: str, option: str, variable: str, schemes: tuple[str, ...]) -> None:
    """FarmError naming the option and variable unless ``url`` looks like ``scheme://host...`` with a known
    scheme (``redis//host`` and ``http://...`` would otherwise fail deep inside kombu or redis-py)."""
    if url is None:
        return
    parts = urlsplit(url)
    example = f"{schemes[0]}://[user:password@]host:port/db"
    if not parts.scheme or "://" not in url:
        raise FarmError(f"{option} ({variable}) = {_redact(url)!r} is not a URL: expected {example}")
    if parts.scheme not in schemes:
        raise FarmError(f"{option} ({variable}): unsupported {what} scheme {parts.scheme!r} in {_redact(url)!r} "
                        f"(supported: {', '.join(schemes)})")
    if parts.scheme != "unix" and not parts.hostname:
        raise FarmError(f"{option} ({variable}) = {_redact(url)!r} names no host: expected {example}")


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@", 1)
    return url


def connection_problem(error: BaseException) -> str | None:
    """A one-line description of an unreachable or misconfigured server, or None for other errors."""
    kind = type(error)
    module = kind.__module__
    if module.startswith(("redis", "kombu", "amqp")) or isinstance(error, (ConnectionError, TimeoutError)):
        return f"cannot reach the server: {kind.__name__}: {error}"
    if isinstance(error, KeyError) and "No such transport" in str(error):
        return f"unsupported broker URL: {error.args[0] if error.args else error}"
    if isinstance(error, OSError) and error.errno is not None:
        return f"{kind.__name__}: {error}"
    return None


@contextlib.contextmanager
def errors(interrupted_hint: str | None = None) -> Iterator[None]:
    """Farm errors and connection problems as one line and exit status 2; Ctrl-C as exit status 130."""
    try:
        yield
    except FarmError as error:
        if getattr(error, "exit_code", None) == EXIT_INTERRUPTED:  # the run's own Ctrl-C (RunInterrupted)
            # The resume advice once: the caller's (it names the command) in place of the error's own.
            said = getattr(error, "headline", None) if interrupted_hint else None
            click.echo(f"\nfarm: interrupted ({said or error})" + (f"; {interrupted_hint}" if interrupted_hint else ""),
                       err=True)
            sys.exit(EXIT_INTERRUPTED)
        fail(str(error))
    except KeyboardInterrupt:
        click.echo("\nfarm: interrupted" + (f"; {interrupted_hint}" if interrupted_hint else ""), err=True)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as error:
        line = connection_problem(error)
        if line is None:
            raise
        fail(line)
