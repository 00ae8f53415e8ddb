# The two commands: `make demo` and `make test`. Everything else is a helper of theirs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test setup gen lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Regenerate muster/v1/*_pb2*.py from proto/ (committed; tests fail when stale).
gen: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

demo: $(STAMP)
	$(BIN)/python scripts/demo.py

# Lint first (seconds), then the whole suite.
test: lint
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy server muster adapters clients

bench: $(STAMP)
	$(BIN)/python bench/cycle.py --nodes 1000 --tasks 10000
	$(BIN)/python bench/cycle.py --nodes 5000 --tasks 10000

clean:
	rm -rf $(VENV) var .pytest_cache
