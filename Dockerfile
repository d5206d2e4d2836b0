# syntax=docker/dockerfile:1.7
# Two targets:
#   operator  slim Python, non-root, no torch:   docker build --target operator -t gluon-rollout-operator .
#   agent     built FROM the serving image, so the probe and self-test see the very stack that serves:
#             docker build --target agent --build-arg BASE_IMAGE=lmsysorg/sglang:<tag>-rocm -t gluon-rollout-agent .

ARG BASE_IMAGE=rocm/pytorch:latest
ARG PYTHON_IMAGE=python:3.12-slim

FROM ${PYTHON_IMAGE} AS operator
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /src
COPY pyproject.toml README.md ./
# The operator's code and the shared ground only: it imports nothing from the agent.
COPY common ./common
COPY operator ./operator
RUN pip install --no-cache-dir . && rm -rf /src
RUN useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin gluon
USER 65532:65532
ENTRYPOINT ["gluon-operator"]

FROM ${BASE_IMAGE} AS agent
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY common ./common
COPY agent ./agent
# --no-deps for the GPU stack: torch, triton and aiter are the serving image's own and must stay so.
RUN python3 -m pip install --no-cache-dir "kopf==1.45.2" "kubernetes==37.0.2" "prometheus-client>=0.20" "pydantic>=2.6" \
 && python3 -m pip install --no-cache-dir --no-deps . && rm -rf /src
# The agent opens /dev/kfd and /dev/dri (render group): the DaemonSet grants that, as UID 65532 (chart values
# agent.gpuAccess and agent.privileged; docs/using/images.md builds and publishes this image).
ENTRYPOINT ["gluon-agent"]
CMD ["run"]
