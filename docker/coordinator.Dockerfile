# The farm without CUDA: the coordinator (`farm tune`, `farm archive ...`) and Flower (`farm flower`).
#
#   docker build -f docker/coordinator.Dockerfile -t tuning-farm/coordinator:local .
#   docker build -f docker/coordinator.Dockerfile --build-arg PYTHON_IMAGE=registry.example/python:3.11 ...
#
# The coordinator never touches a GPU: it expands catalogs, dispatches group tasks to the workers' queues,
# aggregates their results and publishes decisions to the decisions Redis.
#
# Reproducible: the base image comes in through PYTHON_IMAGE (pin it by digest in production: python:3.11-slim-
# bookworm@sha256:...), Python is the base image's own, and every dependency is installed from
# requirements/farm.lock (exact versions, sha256 hashes; regenerate with `python3 tools/dev.py lock`). A base image
# with a virtual environment at /opt/venv (VIRTUAL_ENV/PATH set) is used as is; otherwise pip installs into the
# base image's Python. No `# syntax=` line: the classic builder and BuildKit both build this file without a pull.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# Dependencies first, in their own layers: they change only when a lock file does, not with every source edit.
COPY requirements/build.lock requirements/farm.lock /tmp/requirements/
RUN python3 -m pip install --require-hashes --no-deps -r /tmp/requirements/build.lock \
    && python3 -m pip install --require-hashes --no-deps -r /tmp/requirements/farm.lock \
    && rm -rf /tmp/requirements

# The project from this repository (.dockerignore keeps .venv, .git, .env and caches out of the context), with no
# dependency resolution (--no-deps: the lock is the whole environment) and no download (--no-build-isolation).
COPY pyproject.toml README.md LICENSE /src/
COPY farm /src/farm
COPY kernels /src/kernels
COPY workers /src/workers
COPY coordinator /src/coordinator
COPY fleet /src/fleet
COPY archive_tools /src/archive_tools
COPY cli /src/cli
COPY triton_adapter /src/triton_adapter
RUN python3 -m pip install --no-deps --no-build-isolation /src \
    && rm -rf /src \
    && python3 -m pip check \
    && farm --version

COPY docker/coordinator-healthcheck.sh /usr/local/lib/farm/coordinator-healthcheck.sh

RUN groupadd --system --gid 10001 farm \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/farm --shell /usr/sbin/nologin farm
USER 10001:10001
WORKDIR /home/farm

# Healthy while the Redis servers this container is configured for (FARM_BROKER_URL, FARM_REDIS_URL) answer PING
# through its own credentials. compose.yaml gives Flower its own check (its /healthcheck page).
HEALTHCHECK --interval=30s --timeout=10s --start-period=10s --retries=3 \
    CMD ["/bin/sh", "/usr/local/lib/farm/coordinator-healthcheck.sh"]

# compose.yaml gives each service its command: `farm tune /catalog/...` (coordinator), `farm flower ...` (Flower).
CMD ["farm", "--help"]
