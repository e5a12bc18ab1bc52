# cognitive-proxy — the two commands are `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# `make run PORT=8081` or `COGPROXY_PORT=8081 make run` (likewise HOST / COGPROXY_HOST)
PORT   ?= $(or $(COGPROXY_PORT),8080)
HOST   ?= $(or $(COGPROXY_HOST),127.0.0.1)
# the review console's listener (/review/, /healthz, /readyz, /metrics): the next port by default
ADMIN_PORT ?= $(or $(COGPROXY_ADMIN_PORT),$(shell expr $(PORT) + 1))

.PHONY: run test test-fast lint install redis-server doc-tools browser node-clients phoenix conformance bench peers mutation dashboard-pictures console-pictures clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,lint,fast]'
	touch $(STAMP)

install: $(STAMP)

## run: the proxy on $(HOST):$(PORT) with the embedded default (offline demo provider: no API key, no Redis),
## and the review console on $(HOST):$(ADMIN_PORT) behind an admin key made up at each start (printed once;
## in the environment, not on the command line)
run: install
	@key=$$($(BIN)/python -c 'import secrets; print("sk-demo-admin-" + secrets.token_urlsafe(24))'); \
	echo "Review console: http://$(HOST):$(ADMIN_PORT)/review/ - log in with the demo admin key $$key (a new one each start)"; \
	COGPROXY_ADMIN_KEYS=$$key exec $(BIN)/cogproxy serve --policy policies/demo.yaml --modules modules --host $(HOST) --port $(PORT) --admin-port $(ADMIN_PORT) --log-format console

## redis-server: the suite and the benchmark start their own on a free port; installed here when missing
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
		(apt-get install -y -qq redis-server >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq redis-server; }); } || \
		{ echo "redis-server is missing: apt-get install -y redis-server"; exit 1; }

## doc-tools: curl and jq, which the docs' shell snippets use (their tests run them); installed here when missing
doc-tools:
	@for tool in curl jq; do command -v $$tool >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
		(apt-get install -y -qq $$tool >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq $$tool; }); } || \
		{ echo "$$tool is missing: apt-get install -y $$tool"; exit 1; }; done

## browser: Debian's chromium and its driver, which the review console's browser test drives (Selenium,
## /usr/bin/chromedriver: nothing downloaded at run time); installed here when missing, the test skipped where they cannot be
browser:
	@{ command -v chromium >/dev/null 2>&1 && test -x /usr/bin/chromedriver; } || { command -v apt-get >/dev/null 2>&1 && \
		(apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 || \
		{ apt-get update -qq && apt-get install -y -qq chromium chromium-driver; }); } || \
		echo "chromium is missing (apt-get install -y chromium chromium-driver): the review console's browser test will be skipped"

## test: set everything up and run the whole suite
test: install redis-server doc-tools browser node-clients phoenix
	$(BIN)/python -m pytest

## test-fast: the edit-run loop: everything but the `slow` files (tests/conftest.py SLOW_FILES), on every core, hypothesis profile `fast` (25 examples)
test-fast: install redis-server doc-tools browser node-clients
	$(BIN)/python -m pytest -m "not slow" -n auto -q --hypothesis-profile=fast

## phoenix: Arize Phoenix in a venv of its own (heavy dependencies, none of the proxy's), the real OTLP receiver
## tests/observability/test_phoenix.py sends traces to; the test is skipped where it cannot be installed
PHOENIX_VENV  := .venv-phoenix
PHOENIX_STAMP := $(PHOENIX_VENV)/.installed-stamp
phoenix: $(PHOENIX_STAMP)

$(PHOENIX_STAMP):
	@{ $(PYTHON) -m venv $(PHOENIX_VENV) && $(PHOENIX_VENV)/bin/python -m pip install --quiet 'arize-phoenix>=20.26' && \
		touch $(PHOENIX_STAMP); } || echo "arize-phoenix could not be installed: the Phoenix trace test will be skipped"

## node-clients: openai-node for the client matrix (tests/node, from its package-lock.json); skipped without npm
node-clients: tests/node/node_modules/.package-lock.json

tests/node/node_modules/.package-lock.json: tests/node/package-lock.json
	@if command -v npm >/dev/null; then cd tests/node && { npm ci --no-audit --no-fund --silent || \
		echo "npm ci failed: the Node client tests will be skipped"; }; \
	else echo "npm not found: the Node client tests will be skipped"; fi

## lint: ruff, mypy (strict) on the package and the tests, and the import layers ([tool.importlinter])
lint: install
	$(BIN)/ruff check proxy tests
	$(BIN)/mypy proxy tests
	$(BIN)/lint-imports

## mutation: mutmut on the core modules with their own tests ([tool.mutmut] in pyproject.toml), serial,
## from scratch, hypothesis derandomized; fails when a module scores under 90 %. Slow: not part of `test`.
## The breaker tests use the suite's own redis-server (tests/support/redis_server.py).
mutation: install redis-server
	rm -rf mutants
	$(BIN)/mutmut run --max-children 1
	$(BIN)/python tests/mutation_score.py

## peers: the gateways `make bench` measures beside the proxy (tests/perf/peers.py), pinned: Portkey's
## (npm, run with node) and LiteLLM's proxy (PyPI, a venv of its own); each one that cannot be installed
## (no npm, no network) is left out of the bench's peers section with the reason printed
PEERS_DIR        := .venv-peers
PORTKEY_VERSION  := 1.15.2
LITELLM_VERSION  := 1.108.7
peers: $(PEERS_DIR)/node/.portkey-$(PORTKEY_VERSION) $(PEERS_DIR)/.litellm-$(LITELLM_VERSION)

$(PEERS_DIR)/node/.portkey-$(PORTKEY_VERSION):
	@if command -v npm >/dev/null; then mkdir -p $(PEERS_DIR)/node && \
		{ npm install --prefix $(PEERS_DIR)/node --no-audit --no-fund --silent @portkey-ai/gateway@$(PORTKEY_VERSION) && \
		touch $@ || echo "@portkey-ai/gateway could not be installed: the bench leaves Portkey out"; }; \
	else echo "npm not found: the bench leaves Portkey out"; fi

$(PEERS_DIR)/.litellm-$(LITELLM_VERSION):
	@{ test -x $(PEERS_DIR)/bin/python || $(PYTHON) -m venv $(PEERS_DIR); } && \
		{ $(PEERS_DIR)/bin/python -m pip install --quiet 'litellm[proxy]==$(LITELLM_VERSION)' && touch $@; } || \
		echo "litellm[proxy] could not be installed: the bench leaves LiteLLM out"

## bench: the proxy's overhead against the upstream (needs wrk: apt-get install -y wrk), beside the floor relay and peers
bench: install redis-server peers
	@command -v wrk >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && apt-get install -y -qq wrk; }
	$(BIN)/python tests/perf/bench.py

## console-pictures: docs/images/review-console-*.png, taken by the review console's browser test
console-pictures: install browser
	COGPROXY_CONSOLE_PICTURES=1 $(BIN)/python -m pytest -q -p no:randomly tests/console/test_console_browser.py

## dashboard-pictures: docs/images/dashboard-*.png, each Grafana dashboard's panels drawn (matplotlib) from a
## real Prometheus (Debian's `prometheus`, installed here when missing) scraping ~100 s of load on the proxy
dashboard-pictures: install
	@command -v prometheus >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
		(apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 || \
		{ apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus; }); } || \
		{ echo "prometheus is missing: apt-get install -y --no-install-recommends prometheus"; exit 1; }
	$(BIN)/python -m tests.pictures

conformance: install
	$(BIN)/cogproxy conformance

clean:
	rm -rf $(VENV) $(PEERS_DIR) .pytest_cache .mypy_cache .ruff_cache *.egg-info mutants
