# The farm's GPU worker: `farm worker` for ONE device, on an NVIDIA CUDA runtime image with the matching CuPy wheel.
#
#   docker build -f docker/worker.Dockerfile -t tuning-farm/worker:local .
#   docker build -f docker/worker.Dockerfile --build-arg CUDA_IMAGE=nvidia/cuda:13.0.2-runtime-ubuntu24.04 \
#       --build-arg LOCK=requirements/cuda13.lock -t tuning-farm/worker:cuda13 .     # CUDA 13 drivers (cupy-cuda13x)
#
# Run it with exactly one GPU reserved (compose.yaml: deploy.resources.reservations.devices, device_ids ["N"]).
# Inside the container that GPU is the only visible device, so its index there is 0 and the command is always
# `farm worker --device cuda:0` (the worker sets CUDA_VISIBLE_DEVICES=0 itself, which selects the reserved GPU).
#
# Everything that enters the environment fingerprint comes from this image (farm build = version + sha256 of the
# installed farm/ and kernels/ sources, CuPy, NVRTC, CUDA runtime) or from the host (GPU model, driver version):
# build it once, push it, and run the same image on every host, so that one GPU model means one fingerprint. The
# lock file (exact versions and sha256 hashes, `python3 tools/dev.py lock`) keeps a rebuild of the same source on
# the same CuPy and NVRTC, so on the same fingerprints; pin CUDA_IMAGE by digest for the same CUDA runtime.
#
# Python is the base image's: a virtual environment at /opt/venv if the base image has one, else one created from
# the base image's distribution python3 (Ubuntu 24.04's CUDA images: Python 3.12). Nothing is downloaded but the
# distribution's packages and the locked wheels. compose.cpu.yaml builds this file on a plain Python base image
# with requirements/farm.lock (no CuPy) for the CPU-only container tests.
#
# No `# syntax=` line: the classic builder and BuildKit both build this file without a pull.

# CUDA 12.x runtime (cuBLAS, NVRTC, cuRAND... shared libraries) for the cupy-cuda12x wheel of requirements/
# cuda.lock, as CuPy's own images do. The host driver must support this CUDA version (`nvidia-smi` shows the highest
# it supports); CUDA itself is not initialized at build time (no GPU is visible to `docker build`).
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}
# The dependency lock: requirements/cuda.lock (cupy-cuda12x), cuda13.lock (cupy-cuda13x) or farm.lock (no CuPy).
ARG LOCK=requirements/cuda.lock

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

RUN if [ ! -x /opt/venv/bin/python3 ]; then \
        if ! command -v python3 >/dev/null || ! python3 -c "import venv, ensurepip" 2>/dev/null; then \
            apt-get update \
            && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \
                ca-certificates \
            && rm -rf /var/lib/apt/lists/*; \
        fi \
        && python3 -m venv /opt/venv; \
    fi \
    && python3 -c "import sys; assert sys.version_info >= (3, 11), sys.version"

# Dependencies first, in their own layers: they change only when a lock file does, not with every source edit.
COPY requirements/build.lock /tmp/requirements/build.lock
COPY ${LOCK} /tmp/requirements/deps.lock
RUN python3 -m pip install --require-hashes --no-deps -r /tmp/requirements/build.lock \
    && python3 -m pip install --require-hashes --no-deps -r /tmp/requirements/deps.lock \
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
    && farm --version \
    && python3 -c "import importlib.metadata as m, re; \
print(*[f'{d.name} {d.version}' for d in m.distributions() if re.match('cupy', d.name or '')] or ['no CuPy'])"

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
