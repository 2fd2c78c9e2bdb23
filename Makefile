# Two commands do all set-up on a fresh machine (python3, pip, npm): `make demo` and `make test`.
# Everything installed lives under build/ (ignored by git).

PYTHON ?= python3
BUILD := build
VENV := $(BUILD)/venv
PY := $(VENV)/bin/python
CODEX_VERSION := 0.171.0
CODEX_PREFIX := $(BUILD)/providers/codex
CODEX_STAMP := $(CODEX_PREFIX)/.installed-$(CODEX_VERSION)
DEPS_STAMP := $(VENV)/.deps-installed
# `make demo` needs only agenthost itself and the GUI: not the Claude SDK, not the test tools.
DEMO_STAMP := $(VENV)/.demo-installed
# `make install`: a venv of its own outside the checkout, and `agenthost` linked onto PATH.
INSTALL_VENV ?= $(HOME)/.local/share/agenthost-venv
INSTALL_BIN ?= $(HOME)/.local/bin
PROVIDER ?= tutti-agent
PYTEST_ARGS ?=

.PHONY: demo test lint soak bench venv providers install clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(DEPS_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[test,claude,gui]'
	touch $@ $(DEMO_STAMP)

# A full install (DEPS_STAMP) also satisfies the demo; a demo install alone does not satisfy
# `make test`, which then installs the rest.
$(DEMO_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[gui]'
	touch $@

venv: $(DEPS_STAMP)

$(CODEX_STAMP):
	mkdir -p $(CODEX_PREFIX)
	npm install --silent --no-audit --no-fund --prefix $(CODEX_PREFIX) @openai/codex@$(CODEX_VERSION)
	touch $@

# The pinned Codex (npm) and the venv (pip) install side by side: each waits mostly on its
# registry and its unpacking, not on the other.
providers:
	$(MAKE) --no-print-directory -j2 $(CODEX_STAMP) $(DEPS_STAMP)

install:
	$(PYTHON) -m venv $(INSTALL_VENV)
	$(INSTALL_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(INSTALL_VENV)/bin/python -m pip install --quiet '.[gui]'
	$(INSTALL_VENV)/bin/python -P -m domain.dataclass_code
	mkdir -p $(INSTALL_BIN)
	ln -sf $(INSTALL_VENV)/bin/agenthost $(INSTALL_BIN)/agenthost
	@echo "agenthost installed in $(INSTALL_VENV), linked as $(INSTALL_BIN)/agenthost"
	@echo "(put $(INSTALL_BIN) on PATH if it is not there yet)"

# The codex demo needs the pinned Codex; the default (tutti-agent) needs nothing else.
DEMO_DEPS := $(DEMO_STAMP) $(if $(filter codex,$(PROVIDER)),$(CODEX_STAMP))

demo: $(DEMO_DEPS)
	$(PY) -m client.demo --provider $(PROVIDER)

lint: $(DEPS_STAMP)
	$(VENV)/bin/ruff check domain storage actors transport drivers tutti_agent agenthost client model_fakes workspace protocol tests bench
	$(VENV)/bin/mypy --strict --ignore-missing-imports domain storage actors transport drivers tutti_agent agenthost client model_fakes workspace protocol
	$(VENV)/bin/lint-imports

# pytest exits 5 when it collects no tests; make treats any non-zero exit as failure.
# Most tests wait on real processes (daemons, app-servers, the Claude CLI), so four xdist workers
# share the 2 cores (a quiet run: 805 s wall, 1.8 cores busy on average: docs/performance.md,
# "Each process the host starts, exec → ready, again"); --dist loadfile keeps a file's tests
# (and its module fixtures) on one worker, in order. --durations prints the 25 slowest tests at the end,
# so every run shows where the suite's time goes.
TEST_WORKERS ?= 4
test: providers lint
	AGENTHOST_CODEX_BIN="$(abspath $(CODEX_PREFIX))/node_modules/.bin/codex" \
		$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 $(PYTEST_ARGS)

# The long profile: the reliability suite at soak size, then every test marked `long`.
soak: providers
	AGENTHOST_SOAK=1 AGENTHOST_CODEX_BIN="$(abspath $(CODEX_PREFIX))/node_modules/.bin/codex" \
		$(PY) -m pytest -q tests/reliability $(PYTEST_ARGS)
	AGENTHOST_SOAK=1 AGENTHOST_CODEX_BIN="$(abspath $(CODEX_PREFIX))/node_modules/.bin/codex" \
		$(PY) -m pytest -q -m long --ignore=tests/reliability $(PYTEST_ARGS)

bench: providers
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) -m bench.run_all $(BENCH_ARGS)

clean:
	rm -rf $(BUILD)
