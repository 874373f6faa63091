# syntax=docker/dockerfile:1
# The operator's image: python -m controllers as user 65532, nothing but Python and a
# virtualenv with the library, the operator and their dependencies (uvloop included). Build from the
# repository root:
#
#   docker build -t controller-runtime-py/operator:0.2.0 .
#
# Both stages must use the same base image (the virtualenv links to its interpreter); pin it
# by digest for reproducible builds: --build-arg PYTHON_IMAGE=python:3.11-slim@sha256:...
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
# Dependencies first, in their own layer: it is rebuilt only when pyproject.toml changes.
# Every dependency ships manylinux wheels, so no compiler is needed (or present: slim has none).
COPY pyproject.toml README.md ./
# The library's dependencies and the operator's own (the dependency group "operator").
RUN python -m venv --without-pip /opt/operator \
 && python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb")); print("\n".join(p["project"]["dependencies"] + p["dependency-groups"]["operator"]))' > /tmp/requirements.txt \
 && pip --python /opt/operator/bin/python install --only-binary=:all: -r /tmp/requirements.txt
COPY kubeclient/ kubeclient/
COPY informers/ informers/
COPY controller_runtime/ controller_runtime/
COPY controllers/ controllers/
# The library's wheel (pyproject.toml builds it with setuptools in an isolated environment),
# installed without touching the dependencies resolved above; then the operator itself,
# which is not part of the library's distribution, from the source tree (docs/packaging.md).
RUN pip wheel --no-deps --wheel-dir /tmp/wheels . \
 && pip --python /opt/operator/bin/python install --no-deps /tmp/wheels/*.whl \
 && cp -r controllers /opt/operator/lib/python3.11/site-packages/controllers \
 && /opt/operator/bin/python -m compileall -q /opt/operator/lib/python3.11/site-packages/controllers \
 && /opt/operator/bin/python -c "import controllers.app, uvloop"

FROM ${PYTHON_IMAGE}
# No package manager left for an intruder, and the root filesystem is read-only at run time:
# the bytecode is compiled at install time, so nothing needs writing.
RUN python -m pip uninstall --yes --quiet pip setuptools wheel 2>/dev/null || true
COPY --from=builder /opt/operator /opt/operator
ENV PATH=/opt/operator/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["python", "-m", "controllers"]
