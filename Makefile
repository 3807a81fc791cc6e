PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test test-fast lint types-baseline bench install clean images agent-wheel

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

install: $(BIN)/.installed

run: $(BIN)/.installed
	$(BIN)/python -m console.launcher

# The demo catalog's images (busybox, JupyterLab, PyTorch), built from Debian's packages and
# PyPI into make run's engine (root); `python -m agent.images --storage DIR` builds them elsewhere
images: $(BIN)/.installed
	$(BIN)/python -m console.launcher images

# The host agent's own wheel (agent/pyproject.toml) for GPU hosts: no console, no Django;
# it needs only pip (and PyPI, or a mirror, for setuptools), not the console's venv.
# setuptools builds in agent/build, which would keep modules deleted since: start clean.
AGENT_WHEEL_DIR ?= dist
agent-wheel:
	rm -rf agent/build
	$(PYTHON) -m pip wheel -q --no-deps --wheel-dir $(AGENT_WHEEL_DIR) ./agent
	rm -rf agent/build agent/gpucloud_agent.egg-info

# Tests run side by side in pytest-xdist workers, twice as many as the CPUs (most of a process
# test's time is spent waiting on its processes), at most 8; tests/conftest.py keeps together
# what shares a process or a resource.
TEST_WORKERS ?= $(shell n=$$(( 2 * $$(nproc) )); echo $$(( n < 8 ? n : 8 )))
test: $(BIN)/.installed
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup

# Every test that starts no process (worker, agent, server, Chromium, container, any program;
# tests/conftest.py fails one that does unmarked) and is not marked slow: a check for every
# change, in about a minute. `make test` (and CI) run them all.
FAST_TESTS := not integration and not containers and not browser and not slow
test-fast: $(BIN)/.installed
	$(BIN)/pytest -n auto -m "$(FAST_TESTS)"

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy | $(BIN)/mypy-baseline filter --no-colors
	$(BIN)/python manage.py check
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/python manage.py spectacular --validate --fail-on-warn --file /dev/null

# Record what mypy says now as the baseline `make lint` holds the code to (after fixing errors:
# the baseline only shrinks).
types-baseline: $(BIN)/.installed
	$(BIN)/mypy | $(BIN)/mypy-baseline sync --no-colors --hide-stats

bench: $(BIN)/.installed
	$(BIN)/python bench/scheduler.py --nodes ../shared/traces/openb_node_list_gpu_node.csv --pods ../shared/traces/openb_pod_list_default.csv --fractions

clean:
	-umount --lazy --recursive var-podman/storage 2>/dev/null
	rm -rf var var-podman staticfiles
