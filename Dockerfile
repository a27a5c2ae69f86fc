# infertune images. Build and push both with `scripts/images.sh REGISTRY` (then
# `helm install ... --set image.registry=REGISTRY`), or by hand with BuildKit (Docker 23+):
#
#   docker build --target operator -t REGISTRY/infertune-operator:0.1.0 .   # the operator
#   docker build --target tuner    -t REGISTRY/infertune-tuner:0.1.0 .      # Triton + TRT-LLM + infertune
#
# Both install infertune from the same wheel, built once in the `builder` stage; no source tree is
# copied into a final image. Base images are pinned to exact tags.

# ---------------------------------------------------------------------------------------- builder
FROM python:3.11.13-slim-bookworm AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/src ./operator/src
COPY tuner/src ./tuner/src
# The project's own wheel only (pure Python: it installs on the tuner's Python too).
RUN pip wheel --no-deps --wheel-dir /dist . \
    && ls -l /dist

# ------------------------------------------------------------------------------------------ tuner
# Tuner Jobs on real GPUs: Triton Inference Server with the TensorRT-LLM backend (26.07 ships
# TensorRT-LLM 1.2.1), plus infertune (benchmark driver, Optuna study) and the gRPC client.
FROM nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3 AS tuner

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PYTHONUNBUFFERED=1 \
    MPLBACKEND=Agg

# `pip check` fails the build when infertune's dependencies broke a requirement of what the image
# ships (TensorRT-LLM pins much of its stack): a tuner that imports, but a server that does not
# start, is the failure this stage exists to prevent.
RUN --mount=type=bind,from=builder,source=/dist,target=/dist \
    python3 -m pip install "$(ls /dist/infertune-*.whl)[postgres]" "tritonclient[grpc]" \
    && python3 -m pip check \
    && infertune --help > /dev/null

WORKDIR /workspace
ENTRYPOINT ["infertune"]
CMD ["--help"]

# --------------------------------------------------------------------------------------- operator
# The operator. Also runs simulated tuner Jobs and the simulated serving endpoint (no GPU needed).
# Last stage, so a plain `docker build .` builds this one.
FROM python:3.11.13-slim-bookworm AS operator

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MPLBACKEND=Agg \
    MPLCONFIGDIR=/tmp/matplotlib

RUN --mount=type=bind,from=builder,source=/dist,target=/dist \
    pip install "$(ls /dist/infertune-*.whl)[postgres]" \
    && pip check \
    && infertune --help > /dev/null

# Numeric UID/GID so that Kubernetes can verify runAsNonRoot without resolving names.
RUN groupadd --system --gid 10001 infertune \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/infertune --create-home \
       --shell /usr/sbin/nologin infertune

# An empty working directory: the code lives in site-packages, never beside the process.
WORKDIR /home/infertune
USER 10001:10001

# Kopf's liveness endpoint (`--liveness http://0.0.0.0:8080/healthz`, set by the Helm chart).
EXPOSE 8080

LABEL org.opencontainers.image.title="infertune operator" \
      org.opencontainers.image.description="Kubernetes operator that autotunes LLM inference deployments" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"

ENTRYPOINT ["infertune"]
CMD ["operator", "--all-namespaces"]
