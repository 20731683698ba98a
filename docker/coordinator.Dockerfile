# syntax=docker/dockerfile:1
# The farm without CUDA: the coordinator (`farm tune`, `farm archive ...`) and Flower (`farm flower`).
#
#   docker build -f docker/coordinator.Dockerfile -t tuning-farm/coordinator:local .
#
# The coordinator never touches a GPU: it expands catalogs, dispatches group tasks to the workers' queues,
# aggregates their results and publishes decisions to the decisions Redis.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# The project from this repository (.dockerignore keeps .venv, .git, .env and caches out of the context).
COPY pyproject.toml README.md /src/
COPY farm /src/farm
COPY kernels /src/kernels
COPY workers /src/workers
COPY coordinator /src/coordinator
COPY fleet /src/fleet
COPY cli /src/cli
RUN pip install "/src[farm]" \
    && rm -rf /src \
    && farm --version

RUN groupadd --system --gid 10001 farm \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/farm --shell /usr/sbin/nologin farm
USER 10001:10001
WORKDIR /home/farm

HEALTHCHECK --interval=30s --timeout=10s --start-period=10s --retries=3 CMD ["farm", "--version"]

# compose.yaml gives each service its command: `farm tune /catalog/...` (coordinator), `farm flower ...` (Flower).
CMD ["farm", "--help"]
