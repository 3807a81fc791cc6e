PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test lint bench install clean images

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

install: $(BIN)/.installed

run: $(BIN)/.installed
	$(BIN)/python -m console.launcher

# JupyterLab on Debian, built from Debian's packages and PyPI into the local engine (root)
images: $(BIN)/.installed
	$(BIN)/python -m agent.images

test: $(BIN)/.installed
	$(BIN)/pytest

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python manage.py check
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/python manage.py spectacular --validate --fail-on-warn --file /dev/null

bench: $(BIN)/.installed
	$(BIN)/python bench/scheduler.py --nodes ../shared/traces/openb_node_list_gpu_node.csv --pods ../shared/traces/openb_pod_list_default.csv

clean:
	-umount --lazy --recursive var/podman/storage 2>/dev/null
	rm -rf var staticfiles
