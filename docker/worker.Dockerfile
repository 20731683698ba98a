# syntax=docker/dockerfile:1
# The farm's GPU worker: `farm worker` for ONE device, on an NVIDIA CUDA runtime image with the matching CuPy wheel.
#
#   docker build -f docker/worker.Dockerfile -t tuning-farm/worker:local .
#
# Run it with exactly one GPU reserved (compose.yaml: deploy.resources.reservations.devices, device_ids ["N"]).
# Inside the container that GPU is the only visible device, so its index there is 0 and the command is always
# `farm worker --device cuda:0` (the worker sets CUDA_VISIBLE_DEVICES=0 itself, which selects the reserved GPU).
#
# Everything that enters the environment fingerprint comes from this image (farm build = version + sha256 of the
# installed farm/ and kernels/ sources, CuPy, NVRTC, CUDA runtime) or from the host (GPU model, driver version):
# build it once, push it, and run the same image on every host, so that one GPU model means one fingerprint.

# CUDA 12.x runtime (cuBLAS, NVRTC, cuRAND... shared libraries) for the cupy-cuda12x wheel (the project's `cuda`
# extra), as CuPy's own images do. The host driver must support this CUDA version (`nvidia-smi` shows the highest
# it supports); CUDA itself is not initialized at build time (no GPU is visible to `docker build`).
ARG CUDA_IMAGE=nvidia/cuda:12.4.1-runtime-ubuntu22.04
# uv installs the project's Python (3.11, the version the farm is tested on) and the virtual environment.
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.8

FROM ${UV_IMAGE} AS uv

FROM ${CUDA_IMAGE}
ARG PYTHON_VERSION=3.11

ENV UV_PYTHON_INSTALL_DIR=/opt/python \
    UV_PYTHON_PREFERENCE=only-managed \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_NO_CACHE=1 \
    VIRTUAL_ENV=/opt/farm \
    PATH=/opt/farm/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

COPY --from=uv /uv /usr/local/bin/uv
RUN uv python install "${PYTHON_VERSION}" \
    && uv venv --python "${PYTHON_VERSION}" /opt/farm

# The project from this repository (.dockerignore keeps .venv, .git, .env and caches out of the context).
COPY pyproject.toml README.md /src/
COPY farm /src/farm
COPY kernels /src/kernels
COPY workers /src/workers
COPY coordinator /src/coordinator
COPY fleet /src/fleet
COPY cli /src/cli
RUN uv pip install --python /opt/farm/bin/python "/src[farm,cuda]" \
    && rm -rf /src \
    && farm --version \
    && python -c "import importlib.metadata as m; print('cupy', m.version('cupy-cuda12x'))"

COPY docker/worker-healthcheck.sh /usr/local/lib/farm/worker-healthcheck.sh

# Non-root; a home for CuPy's kernel cache (~/.cupy) and a writable /tmp for the device lock files.
RUN groupadd --system --gid 10001 farm \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/farm --shell /usr/sbin/nologin farm
USER 10001:10001
WORKDIR /home/farm

# Healthy while the worker's presence record in Redis is fresh and not quarantined (docker/worker-healthcheck.sh).
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 \
    CMD ["/bin/sh", "/usr/local/lib/farm/worker-healthcheck.sh", "cuda:0"]

# FARM_BROKER_URL and FARM_REDIS_URL come from the environment (compose.yaml).
CMD ["farm", "worker", "--device", "cuda:0"]
