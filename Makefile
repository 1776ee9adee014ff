# Two commands on a fresh machine: `make check` (the main job) and `make test`.
# Both set up .venv/ first. torch is installed as the local CPU build
# (TORCH_SPEC) unless the interpreter already has a torch, which is then kept.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.dpsim-setup
TORCH_SPEC ?= torch==2.13.0
# The Hypothesis the fast engine's internals were last checked on
# (dpsim/search/internals.py CHECKED_ON): the package takes a range, the
# development set-up this one, so a new patch release cannot change the tests.
HYPOTHESIS_SPEC ?= hypothesis[redis]==6.170.27
# Releases the tests load; fetched once into the dpsim cache ($$DPSIM_CACHE).
TEST_RELEASES ?= 0.11.1 0.12.0 0.13.0 0.17.0 0.18.0 0.20.0 0.22.0 0.24.0 0.25.0 0.28.0 0.29.0 0.30.0 0.32.0 0.33.0 0.34.0
# Fetched with the runner lane's files, in one download each (tests of the
# lane would otherwise fetch these entries a second time while they run).
RUNNER_TEST_RELEASES ?= 0.26.0 0.27.0 0.28.0 0.29.0 0.30.0 0.31.0 0.32.0 0.33.0 0.34.0
# The V1 runner lane's test releases (`--lane runner --runner v1`); a runner-lane
# fetch takes both runners' lane files, so a release in both lists is one download.
V1_RUNNER_TEST_RELEASES ?= 0.12.0 0.13.0 0.14.0 0.17.0 0.18.0 0.20.0 0.21.0 0.25.0 0.26.0 0.29.0 0.33.0
PYTEST_WORKERS ?= auto

.PHONY: setup check test test-fast bench lint docs docs-reference fetch redis-server clean

$(STAMP): pyproject.toml Makefile
	@if [ ! -x $(BIN)/python ]; then \
	  if $(PYTHON) -c 'import torch' 2>/dev/null; then \
	    echo "setup: keeping the torch that $(PYTHON) already has"; \
	    $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else \
	    $(PYTHON) -m venv $(VENV); \
	  fi; \
	fi
	@$(BIN)/python -c 'import torch' 2>/dev/null || \
	  $(BIN)/python -m pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]' "$(HYPOTHESIS_SPEC)"
	@touch $(STAMP)

setup: $(STAMP)

# Each release once, by the first list that names it (a runner-lane fetch
# takes everything the sync lane reads too), FETCH_JOBS at a time: a fetch is
# mostly pip start-up and copying a wheel, which overlap well even on 2 cores.
FETCH_JOBS ?= 4
V1_ONLY_RELEASES := $(filter-out $(RUNNER_TEST_RELEASES),$(V1_RUNNER_TEST_RELEASES))
SYNC_ONLY_RELEASES := $(filter-out $(RUNNER_TEST_RELEASES) $(V1_RUNNER_TEST_RELEASES),$(TEST_RELEASES))

fetch: setup
	@{ for v in $(RUNNER_TEST_RELEASES); do echo "--lane runner $$v"; done; \
	   for v in $(V1_ONLY_RELEASES); do echo "--lane runner --runner v1 $$v"; done; \
	   for v in $(SYNC_ONLY_RELEASES); do echo "$$v"; done; } | \
	  xargs -L 1 -P $(FETCH_JOBS) $(BIN)/dpsim targets --fetch

check: setup
	$(BIN)/dpsim check

# The Redis example-database test runs a real server on loopback (started and
# stopped by the test). Install one where this machine allows it (root with
# apt-get); elsewhere that test skips and says why.
redis-server:
	@command -v redis-server >/dev/null 2>&1 || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "setup: installing redis-server for the Redis example-database test"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends redis-server >/dev/null; \
	else \
	  echo "setup: no redis-server and no root/apt-get to install it; its test will skip"; \
	fi

# Tests by cost. The fast tier mirrors the modules and must need no vLLM
# wheel: it runs against an empty release cache with no package index, so a
# test that quietly loads a release fails there instead of passing on a warm
# cache. The rest load releases (marker release) or start real processes
# (gloo; gpu skips without CUDA).
FAST_TESTS := not release and not gloo and not gpu
# Work stealing: each worker takes a contiguous half of the tests (a module's
# tests share its fixtures and the per-process target caches) and steals from
# the other when it runs dry, so both finish together.
PYTEST := $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal -q

test-fast: setup
	DPSIM_CACHE="$$(mktemp -d)" PIP_NO_INDEX=1 $(PYTEST) -m "$(FAST_TESTS)"

# The fetch runs beside the fast tier: it mostly waits on pip and the disk,
# the fast tier on the CPUs, and neither reads what the other writes (the
# fast tier has a cache of its own). The fetch's output is shown after.
test: setup redis-server
	@log="$$(mktemp)"; \
	  $(MAKE) --no-print-directory fetch >"$$log" 2>&1 & fetching=$$!; \
	  $(MAKE) --no-print-directory test-fast; fast=$$?; \
	  wait $$fetching; fetched=$$?; cat "$$log"; rm -f "$$log"; \
	  [ $$fast = 0 ] && [ $$fetched = 0 ]
	$(PYTEST) -m "not ($(FAST_TESTS))"

bench: setup
	$(BIN)/dpsim bench

lint: setup
	$(BIN)/ruff check dpsim properties tests
	$(BIN)/ruff format --check dpsim properties tests
	$(BIN)/mypy dpsim

# The site, strictly: a broken link, a missing page or anchor is an error
# (tests/test_docs.py builds it the same way in make test).
docs: setup
	$(BIN)/mkdocs build --strict

# The reference pages generated from the code (the CLI's parsers, the file
# readers' checks); make test fails while a committed one differs.
docs-reference: setup
	$(BIN)/python -m dpsim.cli.docs docs/reference

clean:
	rm -rf $(VENV) dpsim-out site .pytest_cache .hypothesis
