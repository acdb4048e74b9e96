# Two entry points: `make demo` (the main job) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# LMCache for its plugin's tests, in a folder of its own (never in the venv: see the
# requirements file), found by the test through GPUFEED_LMCACHE_PATH.
LMCACHE := .lmcache
LMCACHE_REQS := tests/ai/lmcache-requirements.txt
LMCACHE_STAMP := $(LMCACHE)/.installed
# Local wheels (the CPU build of torch on these machines), when present.
export PIP_FIND_LINKS := $(or $(PIP_FIND_LINKS),$(wildcard /opt/wheels))

.PHONY: demo test lint install bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[ai,dev,bench]'
	touch $(STAMP)

$(LMCACHE_STAMP): $(LMCACHE_REQS) $(STAMP)
	rm -rf $(LMCACHE)
	$(BIN)/python -m pip install -q --no-deps --target $(LMCACHE) -r $(LMCACHE_REQS)
	touch $(LMCACHE_STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/gpufeed demo

test: $(STAMP) $(LMCACHE_STAMP) lint
	GPUFEED_LMCACHE_PATH=$(abspath $(LMCACHE)) GPUFEED_REQUIRE_LMCACHE=1 $(BIN)/python -m pytest -q -n 2 --durations=25

lint: $(STAMP)
	$(BIN)/python -m ruff check src tests
	$(BIN)/python -m mypy

bench: $(STAMP)
	$(BIN)/gpufeed bench io --size 1GiB --cold --json docs/bench/io-1gib.json

clean:
	rm -rf $(VENV) $(LMCACHE) .pytest_cache .hypothesis
