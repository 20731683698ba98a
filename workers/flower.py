"""``farm flower``: Flower on the farm's broker, with HTTP basic authentication always required.

Flower runs the farm's own Celery app (``farm_workers.app.create_app``, the same configuration the workers and the
coordinator use), so it decodes the farm's JSON task messages and reads the task events every worker sends
(``--events``; the coordinator sends ``task-sent``). The equivalent plain command is

    FARM_BROKER_URL=redis://... celery -A farm_workers.app flower --basic-auth=user:password

but ``farm flower`` refuses to start without credentials, where ``celery flower`` would serve the dashboard and
its control API (shutdown, pool restart, revoke) to anyone who can reach the port.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from farm.errors import ConfigError
from farm_fleet.settings import Settings

AUTH_SOURCE = "--basic-auth / FARM_FLOWER_BASIC_AUTH"
# Options that would replace or weaken the authentication we set: they come only through --basic-auth.
_AUTH_OPTIONS = ("--basic-auth", "--basic_auth", "--auth", "--auth-provider", "--auth_provider")


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
        name = arg.split("=", 1)[0]
        if name in _AUTH_OPTIONS:
            raise ConfigError("farm flower", name, "***",
                              f"authentication is set only through {AUTH_SOURCE}, not in Flower's own options")
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
