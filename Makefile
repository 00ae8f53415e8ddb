# The two commands: `make demo` and `make test`. Everything else is a helper of theirs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test setup gen lint bench clean install image node-client postgres slurm
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
test: lint node-client postgres slurm
	$(BIN)/python -m pytest -q

# PostgreSQL server binaries for the PostgreSQL store tests (each run starts a throwaway cluster of
# its own; the machine's cluster is never used). Best effort, from apt when missing: without them
# those tests are skipped (and fail when CI is set).
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && { \
		apt-get update -qq >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null 2>&1; }; } || true
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || echo "postgres: no PostgreSQL server here (its tests will be skipped)"

# Slurm for tests/slurm (each run starts a private cluster of its own in a temporary directory; the
# machine's own Slurm, if any, is never touched). Best effort, from apt when missing, with the
# packages' own services neither started nor enabled: without it those tests are skipped.
slurm:
	@bash scripts/slurm-install.sh --best-effort

# The TypeScript / Node client (clients/node): Node from apt when missing, then stubs generated from
# proto/ and compiled. Best effort: without Node its test is skipped, the rest of the suite runs.
node-client:
	@command -v npm >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		apt-get update -qq >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null 2>&1; } || true
	@if command -v npm >/dev/null 2>&1; then \
		cd clients/node && { [ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error; } && \
		npm run --silent build >/dev/null || echo "node-client: build failed (its test will be skipped)"; \
	else echo "node-client: no Node.js here (its test will be skipped)"; fi

lint: $(STAMP)
	$(BIN)/ruff format --check .
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
	rm -rf $(VENV) var .pytest_cache clients/node/node_modules clients/node/dist clients/node/src/generated
