# cognitive-proxy — the two commands are `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
REDIS_HOST ?= 127.0.0.1
REDIS_PORT ?= 6379
PORT   ?= 8080

.PHONY: run test lint install redis conformance bench mutation clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,lint,fast]'
	touch $(STAMP)

install: $(STAMP)

## run: the proxy on :$(PORT) with the embedded default (offline demo provider: no API key, no Redis)
run: install
	$(BIN)/cogproxy serve --policy policies/demo.yaml --modules modules --host 127.0.0.1 --port $(PORT) --log-format console

## redis: make sure a Redis answers on $(REDIS_HOST):$(REDIS_PORT) (started here when installed and down)
redis:
	@if $(BIN)/python -c "import redis,sys; redis.Redis(host='$(REDIS_HOST)', port=$(REDIS_PORT), socket_timeout=1).ping()" 2>/dev/null; then \
		echo "redis: up on $(REDIS_HOST):$(REDIS_PORT)"; \
	elif command -v redis-server >/dev/null 2>&1; then \
		redis-server --daemonize yes --bind $(REDIS_HOST) --port $(REDIS_PORT) --save "" --appendonly no --dir /tmp; \
		for i in 1 2 3 4 5 6 7 8 9 10; do \
			$(BIN)/python -c "import redis; redis.Redis(host='$(REDIS_HOST)', port=$(REDIS_PORT), socket_timeout=1).ping()" 2>/dev/null && break; sleep 0.5; \
		done; echo "redis: started on $(REDIS_HOST):$(REDIS_PORT)"; \
	else \
		echo "redis: not running and redis-server is not installed (apt-get install redis-server)"; \
	fi

## test: set everything up and run the whole suite
test: install redis
	$(BIN)/python -m pytest

## lint: ruff, mypy (strict) on the package and the tests, and the import layers ([tool.importlinter])
lint: install
	$(BIN)/ruff check proxy tests
	$(BIN)/mypy proxy tests
	$(BIN)/lint-imports

## mutation: mutmut on the core modules with their own tests ([tool.mutmut] in pyproject.toml), serial,
## from scratch, hypothesis derandomized; fails when a module scores under 90 %. Slow: not part of `test`.
## The breaker tests write to COGPROXY_TEST_REDIS_URL (default db 15) and flush that database.
mutation: install redis
	rm -rf mutants
	$(BIN)/mutmut run --max-children 1
	$(BIN)/python tests/mutation_score.py

## bench: the proxy's overhead against the upstream (needs wrk: apt-get install -y wrk)
bench: install
	@command -v wrk >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && apt-get install -y -qq wrk; }
	$(BIN)/python tests/perf/bench.py

conformance: install
	$(BIN)/cogproxy conformance

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info mutants
