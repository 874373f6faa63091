# Everything a fresh machine needs is installed by these targets; nothing built lands in the
# repository. The virtualenv and the control-plane binaries live in $(CACHE_DIR).

PYTHON ?= python3
CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/controller-runtime-py
# Each checkout has a virtualenv of its own (its editable install points at that checkout), so
# two checkouts on one machine never re-point each other's environment. The binaries cache in
# $(CACHE_DIR)/bin stays shared. Virtualenvs of checkouts that no longer exist are removed when
# a new one is made.
CHECKOUT_KEY := $(shell echo "$(CURDIR)" | sha1sum | cut -c1-12)
VENV ?= $(CACHE_DIR)/venvs/$(CHECKOUT_KEY)
BIN := $(VENV)/bin
INSTALL_KEY := $(shell cat pyproject.toml | sha1sum | cut -c1-12)
STAMP := $(VENV)/.installed-$(INSTALL_KEY)
PYTEST_ARGS ?=
# TESTS narrows unit, integration and e2e to some files: make e2e TESTS=tests/e2e/test_operator.py
TESTS ?=
ARGS ?=
BENCH_ARGS ?=
BENCH_STAMP := $(VENV)/.bench-installed-$(INSTALL_KEY)

export CONTROLLER_RUNTIME_PY_CACHE := $(CACHE_DIR)

.PHONY: help venv run test test-storage chaos lint typecheck unit integration binaries kine bench bench-storage venv-bench clean-cache postgres node-binaries e2e e2e-ha-numbers test-existing manifests wheel

help:
	@echo "make run        the operator on an embedded local control plane (or the configured cluster)"
	@echo "make test       lint, type-check, then the whole test suite"
	@echo "make test-storage  the informer, guard, Task and sharding suites on kine (SQLite, PostgreSQL)"
	@echo "make chaos      the long chaos run and the stale-cache fuzzer (docs/reliability.md)"
	@echo "make lint       ruff and mypy --strict"
	@echo "make binaries   build (once) and cache etcd, kube-apiserver and kubectl"
	@echo "make bench      the reconcile-throughput benchmarks"
	@echo "make bench-storage  etcd beside kine on SQLite and on PostgreSQL (docs/benchmarks.md)"
	@echo "make manifests  regenerate the CRDs and RBAC in manifests/ from the code"
	@echo "make wheel      build the library's wheel into $(CACHE_DIR)/dist"
	@echo "make e2e        the end-to-end tests on a local cluster with a real node (root)"
	@echo "make e2e-ha-numbers  the PostgreSQL failover scenarios 10 times each on 3 nodes: write gaps"
	@echo "make test-existing  the suite against a local cluster with a node (USE_EXISTING_CLUSTER)"

venv: $(STAMP)

$(STAMP): pyproject.toml
	@mkdir -p $(CACHE_DIR)/venvs
	@sh scripts/prune-venvs.sh $(CACHE_DIR)/venvs
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "$(CURDIR)" > $(VENV)/.checkout
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[testing]' --group dev
	@# The operator and the harness are not in the library's distribution: this checkout's
	@# source tree is on the virtualenv's path instead (docs/packaging.md).
	@$(BIN)/python -c 'import site, sys; open(site.getsitepackages()[0] + "/crpy-source-tree.pth", "w").write(sys.argv[1] + "\n")' "$(CURDIR)"
	@rm -f $(VENV)/.installed-*
	@touch $@

binaries: venv
	$(BIN)/python -m controller_runtime.envtest build

# kine (an etcd API over SQL) for the kine-sqlite and kine-postgres storage, built once.
kine: venv
	$(BIN)/python -m controller_runtime.envtest build --kine

# The local node (docs/e2e.md): Debian packages (runc, CNI plugins, iptables, conntrack,
# mmdebstrap), then kubelet, containerd, CoreDNS, SeaweedFS ... built once into $(CACHE_DIR).
node-binaries: binaries
	@sh scripts/ensure-node-packages.sh
	$(BIN)/python -m controller_runtime.envtest build --node

# The end-to-end tests on a local cluster with real nodes (needs root; not part of `make test`):
# 3 nodes in 3 zones when a collected test needs them, else 1; CRPY_E2E_NODES=N sets it
# (docs/e2e.md). The node's binaries, SeaweedFS and the images are built by the tests' fixtures.
e2e: venv binaries
	@sh scripts/ensure-node-packages.sh
	CRPY_E2E=1 $(BIN)/pytest $(or $(TESTS),tests/e2e) -v -s --timeout=1800 $(PYTEST_ARGS)

# The failover scenarios ten times each (ROUNDS=N for another count) on three nodes: those of
# tests/e2e/test_failover.py on one instance, the node lost and partitioned each on a new one;
# the write gaps, with medians and worst cases, in ha-numbers.json (docs/e2e.md, "High
# availability").
e2e-ha-numbers: venv binaries
	@sh scripts/ensure-node-packages.sh
	CRPY_E2E=1 CRPY_HA_ROUNDS=$(or $(ROUNDS),10) $(BIN)/pytest tests/e2e/test_failover_nodes.py \
		tests/e2e/test_failover.py -v -s --timeout=7200 $(PYTEST_ARGS)

# The suite (as `make test` runs it, without lint) against the local cluster with a node (root):
# USE_EXISTING_CLUSTER=true on a real controller-manager, scheduler, kubelet and kube-proxy.
# The cluster is started first and removed afterwards (README, "The test suite on a cluster").
test-existing: venv binaries kine postgres
	@sh scripts/ensure-node-packages.sh
	$(BIN)/python -m controller_runtime.envtest run --node -- env USE_EXISTING_CLUSTER=true \
		$(BIN)/pytest -m "not chaos_only" $(TESTS) $(PYTEST_ARGS)

# PostgreSQL server binaries for the local server of the postgres tests and `make run`.
postgres:
	@sh scripts/ensure-postgres.sh

# The operator against the configured cluster, or an embedded local control plane if none is.
run: venv binaries postgres
	$(BIN)/python -m controllers.dev $(ARGS)

# CRDs from the typed classes in controllers/api, RBAC from what the controllers watch and
# declare ([tool.controller-runtime] in pyproject.toml); tests fail when they are stale.
manifests: venv
	$(BIN)/python -m controller_runtime manifests

# The library's wheel (controller_runtime, informers, kubeclient; no operator, no harness).
wheel: venv
	$(BIN)/python -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir $(CACHE_DIR)/dist .
	@ls $(CACHE_DIR)/dist/controller_runtime_py-*.whl

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

typecheck: lint

unit: venv
	$(BIN)/pytest $(or $(TESTS),tests/unit) $(PYTEST_ARGS)

integration: venv binaries
	$(BIN)/pytest $(or $(TESTS),tests/integration) $(PYTEST_ARGS)

# Tests marked chaos_only (long, or not yet passing every seed) run in `make chaos` only.
test: lint binaries kine postgres
	$(BIN)/pytest -m "not chaos_only" $(PYTEST_ARGS)

# The suites that matter, again on each SQL storage (docs/informers.md, "Storage backends");
# `make test` already runs tests/integration/storage on all three backends.
STORAGE_SUITES ?= tests/integration/test_informers.py tests/integration/test_guard_proof.py \
	tests/integration/test_task.py tests/integration/test_sharding_informers.py
STORAGE_BACKENDS ?= kine-sqlite kine-postgres
test-storage: venv binaries kine postgres
	@for storage in $(STORAGE_BACKENDS); do \
		echo "== $(STORAGE_SUITES) on $$storage"; \
		CRPY_ENVTEST_STORAGE=$$storage $(BIN)/pytest -m "not chaos_only" \
			$(STORAGE_SUITES) $(PYTEST_ARGS) || exit 1; \
	done

# The long chaos run and the stale-cache fuzzer with many schedules (docs/reliability.md).
# CHAOS_SEED repeats a run; FUZZ_REPORT and CHAOS_REPORT collect the numbers as JSON lines.
FUZZ_EXAMPLES ?= 25
CHAOS_TASKS ?= 2000
CHAOS_SECONDS ?= 60
chaos: venv binaries postgres
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) CHAOS_TASKS=$(CHAOS_TASKS) CHAOS_SECONDS=$(CHAOS_SECONDS) \
		$(BIN)/pytest -s tests/integration/stalecache tests/integration/chaos $(PYTEST_ARGS)

# The benchmarks: the dev and bench extras (kopf, matplotlib), the control-plane binaries, then
# the harness (it builds the Go peer into $(CACHE_DIR) itself). BENCH_ARGS="--quick" for a
# smoke run; see docs/benchmarks.md. Not part of `make test`.
venv-bench: $(BENCH_STAMP)

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --group bench
	@rm -f $(VENV)/.bench-installed-*
	@touch $@

bench: venv-bench binaries
	$(BIN)/python -m bench $(BENCH_ARGS)

# The storage comparison (docs/benchmarks.md, "Storage"): etcd, kine on SQLite, kine on
# PostgreSQL, one after another. BENCH_ARGS="--storage-sizes 10000,100000,1000000 ..." to
# change the ladder; --quick for a smoke run.
STORAGE_BENCH ?= etcd,kine-sqlite,kine-postgres
bench-storage: venv-bench binaries kine postgres
	$(BIN)/python -m bench --storage $(STORAGE_BENCH) $(BENCH_ARGS)

clean-cache:
	rm -rf $(CACHE_DIR)
