# elastic-step: `make demo` and `make test` set up .venv when it is missing or stale.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
UV_VERSION := 0.13.9
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-unit test-e2e lint format proto bench clean

setup: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	$(BIN)/uv pip install -q --python $(BIN)/python -r requirements.lock
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -e .
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/elastic-step demo

test: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit tests/e2e

test-unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

test-e2e: $(STAMP)
	$(BIN)/python -m pytest -q tests/e2e

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

proto: $(STAMP)
	$(BIN)/python elastic_step/rpc/generate.py

bench: $(STAMP)
	$(BIN)/python bench/throughput.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
