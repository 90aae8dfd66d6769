# syntax=docker/dockerfile:1
# One image for every agentlearn process; the service or the pass is its argument (docs/deploy.md):
#
#   docker build -t agentlearn:0.1.0 .
#   docker run --rm -p 50051:50051 -p 8080:8080 agentlearn:0.1.0         # all-in-one, offline, tokens
#   docker exec <container> python -m services.runner token issue --company C --scopes ...
#   docker run --rm agentlearn:0.1.0 serve diary --port 50061 --host 0.0.0.0
#   docker run --rm agentlearn:0.1.0 pass diary-fill
#
# The local embedding model (MiniLM, ONNX) ships inside the pip packages, so the image runs with
# no network and no keys. It runs as the numeric user 10001 and writes only under /tmp (and
# /app/data for the all-in-one's embedded PostgreSQL and Qdrant), so a read-only root filesystem
# works.

ARG PYTHON_IMAGE=python:3.11-slim

# ---------------------------------------------------------------- build: venv + generated stubs
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The runtime venv gets requirements.lock only: no pytest, ruff, grpcio-tools or kubernetes-validate
# (requirements-dev.lock) in the image.
RUN python -m venv /opt/venv
COPY requirements.lock requirements-dev.lock /tmp/
RUN /opt/venv/bin/pip install --no-compile -r /tmp/requirements.lock
# grpcio-tools generates the stubs in a throwaway venv of its own, at the dev lock's pin.
RUN python -m venv /opt/tools \
 && /opt/tools/bin/pip install --no-compile "$(grep '^grpcio-tools==' /tmp/requirements-dev.lock)"
WORKDIR /src
COPY protos/ protos/
# What ./run's ensure_stubs does: gRPC stubs from protos/ (they become libs/common/gen in the image).
RUN set -eu; \
    include="$(/opt/tools/bin/python -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')"; \
    mkdir gen; \
    /opt/tools/bin/python -m grpc_tools.protoc -I protos -I "$include" \
      --python_out=gen --grpc_python_out=gen --pyi_out=gen $(find protos -name '*.proto' | sort); \
    find gen -type d -exec sh -c 'touch "$0/__init__.py"' {} \;

# ---------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app:/app/libs/common/gen \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
RUN groupadd --system --gid 10001 agentlearn \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
      --shell /usr/sbin/nologin agentlearn
WORKDIR /app
COPY --from=build /opt/venv /opt/venv
COPY libs/ libs/
COPY services/ services/
COPY --from=build /src/gen/ libs/common/gen/
# Bytecode is compiled now, because the root filesystem is read-only at run time.
RUN python -m compileall -q /opt/venv/lib /app/libs /app/services \
 && mkdir -p /app/data \
 && chown 10001:10001 /app/data
USER 10001:10001
EXPOSE 50051 8080
ENTRYPOINT ["python", "-m", "services.runner"]
# A container's port is not loopback: the all-in-one requires tokens there (docs/security.md).
CMD ["up", "--host", "0.0.0.0", "--require-auth"]
