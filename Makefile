# The README's two commands: `make up` (the local embedded default, end to end) and `make test`.
# Both start with `make setup`: the virtualenv and the cached Go toolchain, no cluster.
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.strata-installed

.PHONY: setup venv console-assets toolchain host-packages image up down test test-unit bench clean

setup: venv console-assets toolchain host-packages

venv: $(STAMP)

$(STAMP): pyproject.toml
	@echo "==> creating $(VENV) and installing strata (pinned Pulumi SDK 3.259.0, Kopf, ...)"
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	@$(VPY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	@$(VPY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

# The console's client-side library (htmx), pinned by its lock file and served from node_modules, never a CDN.
CONSOLE_WEB := components/console/web
console-assets: $(CONSOLE_WEB)/node_modules/.package-lock.json

$(CONSOLE_WEB)/node_modules/.package-lock.json: $(CONSOLE_WEB)/package-lock.json
	@command -v npm >/dev/null || { echo "npm is missing: install Node.js (apt-get install -y npm), then make setup"; exit 1; }
	@npm ci --prefix $(CONSOLE_WEB) --no-audit --no-fund --loglevel=error

toolchain: venv
	@$(VENV)/bin/strata local toolchain

# Real nodes (`strata local up --real-nodes N`) need containerd, runc, CNI plugins and image tools from
# Debian, and the console's browser test Chromium and its driver: installed as root, else named (kwok
# nodes and the other tests need none of it).
host-packages: venv
	@$(VENV)/bin/strata local host-packages

# The operator image, built without a registry and loaded into every running real node.
image: setup
	@$(VENV)/bin/strata image build

# STACK=cluster: Pulumi.cluster.yaml on the stand-in for a cluster you already have (the cluster profile:
# real nodes, registry, object store; needs root), Flux and the operator in-cluster (default: dev).
STACK ?= dev

# TIMEOUT=<seconds>: how long `make up` waits for every Stack to be Ready (default 1200).
# Checks first (seconds, standard library only): without the Python language host or the provider
# plugins the dev stack cannot run, and nobody should wait for a 25-minute build to learn that.
up:
	@$(PYTHON) components/local/preflight.py
	@$(MAKE) --no-print-directory setup
	@$(VENV)/bin/strata dev up --stack $(STACK) $(if $(TIMEOUT),--timeout $(TIMEOUT))

# FORCE=1: a Stack whose destroy cannot finish loses its finalizer (its resources stay) instead of
# stopping `make down`; every local process is stopped either way.
down: venv
	@$(VENV)/bin/strata dev down --stack $(STACK) $(if $(FORCE),--force)

test: setup
	@$(VPY) tests/run.py

test-unit: venv console-assets
	@$(VPY) tests/run.py --tiers unit

bench: setup
	@$(VPY) benchmarks/local_platform.py

clean:
	rm -rf $(VENV) .pytest_cache
