# The two commands: `make demo` and `make test`. Everything else is a helper of theirs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test setup gen lint bench clean install image
PREFIX ?= $(HOME)/.local

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

# Put the commands on PATH: links in $(PREFIX)/bin (default ~/.local/bin) to the project's venv.
install: $(STAMP)
	mkdir -p $(PREFIX)/bin
	for cmd in muster muster-server muster-agent muster-k8s-adapter muster-slurm-adapter; do \
		ln -sf $(abspath $(BIN))/$$cmd $(PREFIX)/bin/$$cmd; done
	@echo "installed into $(PREFIX)/bin (make sure it is on PATH): muster --version"

# The container image deploy/kubernetes and deploy/helm run.
image:
	docker build -t ghcr.io/muster-sched/muster:$$($(PYTHON) -c 'import tomllib;print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])') .

clean:
	rm -rf $(VENV) var .pytest_cache
