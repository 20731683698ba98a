"""``farm flower``: Flower on the farm's broker, with HTTP basic authentication always required.

Flower runs the farm's own Celery app (``farm_workers.app.create_app``, the same configuration the workers and the
coordinator use), so it decodes the farm's JSON task messages and reads the task events every worker sends
(``--events``; the coordinator sends ``task-sent``). The equivalent plain command is

    FARM_BROKER_URL=redis://... celery -A farm_workers.app flower --basic-auth=user:password

but ``farm flower`` refuses to start without credentials, where ``celery flower`` would serve the dashboard and
its control API (shutdown, pool restart, revoke) to anyone who can reach the port. Credentials come from
``FARM_FLOWER_BASIC_AUTH`` or a file (``--basic-auth-file``), never from the command line, where ``ps`` shows
them; Flower's own authentication options, in any spelling Flower accepts (``-basic_auth=``, ``--auth``...), and its
configuration file option are refused among the passthrough arguments.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from farm.errors import ConfigError
from farm_fleet.settings import Settings

AUTH_VARIABLE = "FARM_FLOWER_BASIC_AUTH"
AUTH_SOURCE = f"{AUTH_VARIABLE} / --basic-auth-file"
# Flower (tornado) options that would replace or weaken the authentication we set, after the normalization tornado
# applies (leading dashes stripped, "_" -> "-"); "conf" would load a file that can set any of them.
_REFUSED = frozenset({"basic-auth", "auth", "auth-provider", "oauth2-key", "oauth2-secret", "oauth2-redirect-uri",
                      "conf"})
# Environment variables Flower reads as options (FLOWER_<OPTION>).
_REFUSED_ENV = ("FLOWER_BASIC_AUTH", "FLOWER_AUTH", "FLOWER_AUTH_PROVIDER", "FLOWER_OAUTH2_KEY", "FLOWER_OAUTH2_SECRET")


def credentials(path: Path | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The basic-auth value from ``path`` (first non-empty line) or from FARM_FLOWER_BASIC_AUTH; ConfigError when
    both or neither are given, or the file cannot be read."""
    environ = os.environ if environ is None else environ
    from_env = environ.get(AUTH_VARIABLE, "").strip()
    if path is None:
        if not from_env:
            raise ConfigError(AUTH_SOURCE, "basic_auth", "", f"required: set {AUTH_VARIABLE} or give --basic-auth-file")
        return from_env
    if from_env:
        raise ConfigError(AUTH_SOURCE, "basic_auth", "***", f"give {AUTH_VARIABLE} or --basic-auth-file, not both")
    try:
        lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(str(path), "basic_auth", None, f"cannot read the credentials file: {e}") from e
    found = [line for line in lines if line and not line.startswith("#")]
    if len(found) != 1:
        raise ConfigError(str(path), "basic_auth", "***", "must hold one line user:password[,user:password]")
    return found[0]


def _option_name(arg: str) -> str | None:
    """The option an argument sets, as Flower (tornado) reads it, or None for a plain value."""
    if not arg.startswith("-"):
        return None
    return arg.lstrip("-").split("=", 1)[0].replace("_", "-").strip().lower()


def check_basic_auth(basic_auth: str | None) -> list[str]:
    """The ``user:password`` entries of a ``user:password[,user:password]`` value; ConfigError (naming
    FARM_FLOWER_BASIC_AUTH and --basic-auth, never echoing a password) when it is empty or malformed."""
    if basic_auth is None or not basic_auth.strip():
        raise ConfigError(AUTH_SOURCE, "basic_auth", "", "required: Flower never runs without authentication")
    entries = basic_auth.split(",")
    for position, entry in enumerate(entries, 1):
        user, colon, password = entry.partition(":")
        shown = f"{user}:***" if colon else "***"
        if not colon or not user or not password:
            raise ConfigError(AUTH_SOURCE, "basic_auth", shown,
                              f"entry {position} must be user:password with a non-empty user and password")
        if entry != entry.strip() or any(c.isspace() for c in user):
            raise ConfigError(AUTH_SOURCE, "basic_auth", shown,
                              f"entry {position} has white space around or inside the user name")
    return entries


def flower_argv(address: str, port: int, basic_auth: str, extra_args: Sequence[str] = ()) -> list[str]:
    """The ``celery`` command line that runs Flower (after checking the credentials and the extra options)."""
    check_basic_auth(basic_auth)
    for arg in extra_args:
        name = _option_name(arg)
        if name in _REFUSED:
            raise ConfigError("farm flower", arg.split("=", 1)[0], "***",
                              f"authentication is set only through {AUTH_SOURCE}, not in Flower's own options")
    for variable in _REFUSED_ENV:
        if os.environ.get(variable):
            raise ConfigError("farm flower", variable, "***",
                              f"Flower would read authentication from {variable}: unset it and use {AUTH_SOURCE}")
    if not 0 < port < 65536:
        raise ConfigError("farm flower", "--port", port, "must be a TCP port (1-65535)")
    return ["flower", f"--address={address}", f"--port={port}", f"--basic-auth={basic_auth}", *extra_args]


def run_flower(broker: str, address: str, port: int, basic_auth: str, extra_args: Sequence[str] = ()) -> int:
    """Run Flower on ``address:port`` against ``broker`` until it is stopped (SIGTERM or SIGINT); return the exit
    status. ``extra_args`` are Flower's own options (``--url-prefix=...``, ``--persistent=True``, ...)."""
    if not broker:
        raise ConfigError("farm flower", "--broker", broker, "the farm's broker URL is required (FARM_BROKER_URL)")
    argv = flower_argv(address, port, basic_auth, extra_args)
    # As `farm worker` does: the farm's app (farm_workers.app:app) reads its broker from the environment when first
    # imported. A second app would only re-register the same shared tasks (Celery warns about that).
    os.environ["FARM_BROKER_URL"] = broker
    import farm_workers.app

    app = farm_workers.app.app
    if app.conf.broker_url != broker:  # imported earlier in this process, for another broker
        app = farm_workers.app.create_app(Settings.from_env(broker_url=broker))
    status = app.start(argv=argv)
    return int(status or 0)
