# One image for every process of the fleet: `serve front`, `serve cluster` and `agent`
# (the entrypoint is the `provisioner` command; the Kubernetes manifests pass the rest).
#
#   docker build -t provisioner:0.1.0 .
#   docker run --rm provisioner:0.1.0 serve cluster --name us-central1 ...
#
# Two stages: the builder resolves and installs the package and its dependencies, as pinned in
# pyproject.toml (the [server] extra), into a virtual environment; the final image is the slim
# Python base plus that environment, with no compiler, no pip and no package index, running as
# an unprivileged user.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# ctr, containerd's client: the VM agent pulls image layers through the node's containerd.
RUN apt-get update \
 && apt-get install -y --no-install-recommends containerd \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/provisioner
WORKDIR /src
COPY pyproject.toml README.md ./
COPY provisioner ./provisioner
RUN /opt/provisioner/bin/pip install ".[server]" \
 && /opt/provisioner/bin/pip uninstall -y pip setuptools

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/provisioner/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PROVISIONER_DATA_DIR=/var/lib/provisioner \
    PROVISIONER_CLUSTERS=/etc/provisioner
RUN groupadd --system --gid 10001 provisioner \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin provisioner \
 && install -d -o 10001 -g 10001 /var/lib/provisioner
COPY --from=builder /opt/provisioner /opt/provisioner
COPY --from=builder /usr/bin/ctr /usr/local/bin/ctr
# The shipped fleet config; a deployment mounts its own here (the ConfigMap made from clusters/).
COPY clusters/*.yaml /etc/provisioner/
USER 10001:10001
WORKDIR /var/lib/provisioner
# front 50051, clusters 50061-50063, health (plaintext, grpc.health.v1 only) 8081, metrics 9464
EXPOSE 50051 50061 8081 9464
ENTRYPOINT ["provisioner"]
CMD ["--help"]
