# Two entry points: `make demo` (the main job) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Local wheels (the CPU build of torch on these machines), when present.
export PIP_FIND_LINKS := $(or $(PIP_FIND_LINKS),$(wildcard /opt/wheels))

.PHONY: demo test install bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[ai,dev,bench]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/gpufeed demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/gpufeed bench io --size 1GiB --cold --json docs/bench/io-1gib.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
