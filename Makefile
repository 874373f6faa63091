# Everything a fresh machine needs is installed by these targets; nothing built lands in the
# repository. The virtualenv and the control-plane binaries live in $(CACHE_DIR).

PYTHON ?= python3
CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/controller-runtime-py
VENV ?= $(CACHE_DIR)/venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
PYTEST_ARGS ?=
ARGS ?=

export CONTROLLER_RUNTIME_PY_CACHE := $(CACHE_DIR)

.PHONY: help venv run test lint typecheck unit integration binaries bench clean-cache

help:
	@echo "make run        the operator on an embedded local control plane (or the configured cluster)"
	@echo "make test       lint, type-check, then the whole test suite"
	@echo "make lint       ruff and mypy --strict"
	@echo "make binaries   build (once) and cache etcd, kube-apiserver and kubectl"
	@echo "make bench      the reconcile-throughput benchmarks"

venv: $(STAMP)

$(STAMP): pyproject.toml
	@mkdir -p $(CACHE_DIR)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $@

binaries: venv
	$(BIN)/python -m controller_runtime.envtest build

# The operator against the configured cluster, or an embedded local control plane if none is.
run: venv binaries
	$(BIN)/python -m controllers.dev $(ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

typecheck: lint

unit: venv
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

integration: venv binaries
	$(BIN)/pytest tests/integration $(PYTEST_ARGS)

test: lint binaries
	$(BIN)/pytest $(PYTEST_ARGS)

clean-cache:
	rm -rf $(CACHE_DIR)
