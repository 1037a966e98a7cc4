# The two commands a newcomer needs: `make demo` and `make test`. Both create .venv and
# install what they need; neither needs a system Postgres or Redis (embedded ones start
# under .data/ unless DATABASE_URL / REDIS_URL point to running servers).

PYTHON ?= $(shell command -v python3.12 || command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint install bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert (3, 11) <= sys.version_info[:2] <= (3, 12), "Python 3.11 or 3.12 is required"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m config.demo

lint: $(STAMP)
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports --no-cache

test: lint
	$(PY) -m config.embedded -- $(PY) -m pytest

bench: $(STAMP)
	$(PY) -m config.embedded -- $(PY) bench/ingest.py --write-docs

clean:
	rm -rf .data staticfiles .pytest_cache .ruff_cache
