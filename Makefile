# The two commands a newcomer needs: `make demo` and `make test`. Both create .venv and
# install what they need; neither needs a system Postgres or Redis (embedded ones start
# under .data/ unless DATABASE_URL / REDIS_URL point to running servers).

# The first of these that runs and is 3.11 or 3.12 (a shim that exists but fails is skipped).
PYTHON ?= $(shell for p in python3.12 python3.11 python3; do \
	$$p -c 'import sys; assert (3, 11) <= sys.version_info[:2] <= (3, 12)' >/dev/null 2>&1 && { command -v $$p; break; }; done)
VENV := .venv
PY := $(VENV)/bin/python
# The demo needs the service extra only; tests add the dev extra. (A GPU node's agent needs
# neither: `pip install '.[agent]'`, docs/agent.md.)
RUNTIME := $(VENV)/.installed-runtime
DEV := $(VENV)/.installed-dev

.PHONY: demo test suite test-quick test-dates soak lint install bench clean browser-deps monitoring-deps pdf-deps focus-validator screenshots

$(PY):
	@test -n "$(PYTHON)" || { echo "Python 3.11 or 3.12 is required (set PYTHON=/path/to/python3.x)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

# pip compiles what it installs one file at a time, after installing: about half of a fresh
# environment's install (104 s for the dev extra on the 2-core machine, 54 s without compiling).
# Compiled here on every core instead (23 s): the same .pyc files, which every process of the suite
# and the demo reads rather than compiling again.
PIP_INSTALL = $(PY) -m pip install --quiet --disable-pip-version-check --no-compile
COMPILE_INSTALLED = $(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null

$(RUNTIME): pyproject.toml | $(PY)
	$(PIP_INSTALL) -e '.[service]'
	$(COMPILE_INSTALLED)
	@touch $(RUNTIME)

$(DEV): pyproject.toml | $(PY)
	$(PIP_INSTALL) -e '.[service,dev]'
	$(COMPILE_INSTALLED)
	@touch $(DEV) $(RUNTIME)

install: $(DEV)

demo: $(RUNTIME)
	$(PY) -m config.demo

# mypy's Django plugin loads the settings, which require DATABASE_URL and REDIS_URL to be set but
# never connect to either: when they are unset, unreachable .invalid addresses are given, so
# type-checking needs no running server.
TYPECHECK_URLS = DATABASE_URL="$${DATABASE_URL:-postgres://unused.invalid/typecheck}" \
	REDIS_URL="$${REDIS_URL:-redis://unused.invalid/0}"

# mypy's incremental cache lives beside pip's, outside the checkout: a fresh clone (CI's) then checks
# only the files whose contents differ from the cache's (mypy compares hashes, not paths or mtimes),
# seconds instead of about 50 s of CPU beside the suite. A cache of another mypy, Python or set of
# options is stale to mypy, and it checks afresh.
MYPY_CACHE ?= $${XDG_CACHE_HOME:-$$HOME/.cache}/vgpu-ledger/mypy

lint: $(DEV)
	$(LINT_NICE) $(PY) -m ruff check .
	$(LINT_NICE) $(VENV)/bin/lint-imports --no-cache
	$(TYPECHECK_URLS) $(LINT_NICE) $(PY) -m mypy --strict --cache-dir "$(MYPY_CACHE)" config billing agents allocator tests bench

# Browser tests drive Debian's Chromium (never a browser downloaded by Playwright); the CJK
# fonts let it render the Simplified Chinese interface.
SUDO := $(shell [ "$$(id -u)" = 0 ] || command -v sudo >/dev/null && [ "$$(id -u)" != 0 ] && echo sudo)
APT_BROWSER := chromium fonts-noto-cjk

# $(call apt_install,PACKAGES,REASON): Debian packages, with one `apt-get update` only when needed.
apt_install = $(SUDO) apt-get install -y --no-install-recommends $(1) >/dev/null \
	  || { $(SUDO) apt-get update >/dev/null && $(SUDO) apt-get install -y --no-install-recommends $(1) >/dev/null; } \
	  || { echo "could not install $(1) with apt-get: $(2)"; exit 1; }

browser-deps:
	@if [ ! -x /usr/bin/chromium ] || ! fc-list :lang=zh 2>/dev/null | grep -q .; then \
	  echo "installing Debian's $(APT_BROWSER) for the browser tests"; \
	  $(call apt_install,$(APT_BROWSER),the browser tests need them); \
	fi

# promtool checks the alert rules, their unit tests and real /metrics expositions (tests/deploy/test_monitoring.py).
monitoring-deps:
	@command -v promtool >/dev/null || { echo "installing Debian's prometheus for promtool"; \
	  $(call apt_install,prometheus,the monitoring tests need promtool); }
	@test -e /usr/lib/nginx/modules/ngx_http_js_module.so || { echo "installing nginx with njs for the OpenCost gateway test"; \
	  $(call apt_install,nginx-light libnginx-mod-http-js,tests/test_opencost_clients.py runs the shipped gateway); }

# qpdf checks every PDF we ship: structure, embedded fonts, no missing glyph (tests/pdf_check.py).
pdf-deps:
	@command -v qpdf >/dev/null || { echo "installing Debian's qpdf"; \
	  $(call apt_install,qpdf,the PDF tests need qpdf); }

# The FinOps Foundation's focus-validator checks every FOCUS file we write (tests/billing/test_focus_validator.py).
# It gets an environment of its own: it pins numpy<2 and its own pandera, duckdb and polars, which .venv must
# not inherit. Its 2.x releases (FOCUS 1.2 rules) need Python >= 3.12, which the service itself does not:
# the first of these that runs and is >= 3.12 (pyenv's shims exist for every installed version but fail
# for one that is not selected, so pyenv's own installs are tried by path too), else Debian's python3.
# 3.12 comes first: numpy<2 has wheels for it, while on 3.13 pip compiles numpy from source (over four
# minutes on a 2-core machine, every fresh clone whose pip cache lacks the wheel).
PYENV_PYTHONS = ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$(1)/bin/python3 2>/dev/null | sort -rV
FOCUS_PYTHON ?= $(shell for p in python3.12 $$($(call PYENV_PYTHONS,3.12*)) python3.13 $$($(call PYENV_PYTHONS,3.1[3-9]*)) /usr/bin/python3 python3; do \
	$$p -c 'import sys; assert sys.version_info[:2] >= (3, 12)' >/dev/null 2>&1 && { command -v $$p; break; }; done)
FOCUS_VENV := .venv-focus-validator
$(FOCUS_VENV)/.installed: tests/requirements-focus-validator.txt
	@test -n "$(FOCUS_PYTHON)" || { echo "focus-validator 2.x needs Python 3.12 or newer and none was found" \
	  "(tried python3.12, python3.13, pyenv's versions, python3). Debian 12's python3 is 3.11, so apt-get cannot" \
	  "help there; install one (pyenv, or Debian 13's python3 and python3-venv) or set FOCUS_PYTHON=/path/to/python3.12"; exit 1; }
	rm -rf $(FOCUS_VENV)
	$(FOCUS_PYTHON) -m venv $(FOCUS_VENV)
	$(FOCUS_VENV)/bin/pip install --quiet --disable-pip-version-check -r tests/requirements-focus-validator.txt
	@touch $@

focus-validator: $(FOCUS_VENV)/.installed

# The suite on TEST_WORKERS processes (default 3; tests/workers.py gives each its own test database
# and Redis db). --dist loadgroup keeps the tests on the shared demo on one worker, started first.
PYTEST_PARALLEL = -n $(or $(TEST_WORKERS),3) --dist loadgroup

# The Debian packages first, one after another (apt-get holds one lock); then the two environments
# side by side (one waits mostly on CPU, the other on the package index); then lint beside the suite:
# the suite's length is its longest chain of tests (the shared demo's), which leaves room for
# ruff, import-linter and mypy, niced so that they take the CPU the chain leaves (LINT_NICE; the
# off-chain test workers give way too, tests/workers.py). Either failing fails `make test`, after
# both have finished.
test: browser-deps monitoring-deps pdf-deps
	$(MAKE) --no-print-directory -j2 $(DEV) focus-validator
	$(MAKE) --no-print-directory -j2 lint suite LINT_NICE="nice -n 5"

# The checkout's own modules compiled once, before the suite starts its processes. pip compiles
# what it installs into .venv, but nothing compiles the checkout, and where PYTHONDONTWRITEBYTECODE
# is set (as on the machines this suite runs on) no process writes what it compiled either: each of
# the suite's Python processes (its workers, and the demos, agents, Celery workers, gunicorn and
# manage.py commands they start) compiled every module of ours it imported, about 0.35 s of CPU
# for each Django start. Processes still read what is here; a source edited later is compiled
# again (the cache compares modification times). pytest's own cache of the modules whose asserts it
# rewrites (the tests, the conftests and the pytest plugins' packages) is written here too, once, for
# the same reason: each of the suite's pytest processes rewrote them again, about 8 s of CPU each
# (tests/rewrite_cache.py).
SOURCES := config billing agents allocator tests bench manage.py
.PHONY: bytecode
bytecode: | $(PY)
	$(PY) -m compileall -q -j 0 $(SOURCES)
	$(PY) -m tests.rewrite_cache

# The whole suite, without lint (`make test` runs lint beside it).
suite: $(DEV) focus-validator bytecode
	$(PY) -m config.embedded -- $(PY) -m pytest $(PYTEST_PARALLEL)

# The unit tests only: no demo, no browser, nothing marked slow (tests/workers.py marks them).
test-quick: $(DEV) bytecode
	$(PY) -m config.embedded -- $(PY) -m pytest $(PYTEST_PARALLEL) -m "not demo and not browser and not soak and not slow"

# The whole suite with the clock of the whole process tree at the edges of months and years
# (tests/dates.py; Debian's faketime). TEST_DATES_ARGS passes e.g. `--at 2027-06-30T23:59:00Z -- tests/billing`.
test-dates: lint browser-deps pdf-deps focus-validator bytecode
	@command -v faketime >/dev/null || { echo "installing Debian's faketime"; $(call apt_install,faketime,make test-dates needs it); }
	$(PY) -m tests.dates $(TEST_DATES_ARGS)

# Refreshes the README's screenshots from a live demo (the browser tests take them). The tests
# take more shots than the README shows (both languages, every form): they land under .data/ and
# only the README's images are copied, so a shot a test stopped taking fails here, not silently.
SHOTS := .data/screenshots
screenshots: $(DEV) browser-deps pdf-deps
	rm -rf $(SHOTS)
	VGPU_SCREENSHOTS_DIR=$(SHOTS) VGPU_BROWSER_HISTORY_DAYS=7 \
	  $(PY) -m config.embedded -- $(PY) -m pytest tests/browser -q
	for f in $$(grep -o 'docs/screenshots/[a-z0-9-]*\.png' README.md | sort -u); do \
	  cp $(SHOTS)/$$(basename $$f) $$f || exit 1; done

bench: $(DEV)
	$(PY) -m config.embedded -- $(PY) bench/ingest.py --write-docs

# The synthetic fleet through ingest, rollup and pages, per 1,000 GPUs (bench/README.md, docs/scaling.md).
# FLEET_ARGS passes e.g. `--gpus 400 --minutes 20 --rollup-workers 1 2`.
.PHONY: bench-fleet
bench-fleet: $(DEV)
	$(PY) -m config.embedded -- $(PY) bench/fleet.py --write-docs $(FLEET_ARGS)

soak: $(DEV)
	$(PY) bench/soak.py --minutes $(or $(SOAK_MINUTES),20) --write-docs

clean:
	rm -rf .data staticfiles .pytest_cache .ruff_cache

# On a machine with an NVIDIA driver (no CUDA toolkit needed): the agent's NVML readings beside
# nvidia-smi's and its MPS commands against a private daemon, under a load it starts itself
# (docs/agent.md, "Checking on a real GPU"). GPU_CHECK_ARGS passes e.g. `--save-fixtures DIR`.
.PHONY: gpu-check
gpu-check: $(RUNTIME)
	$(PY) -m agents.gpu_check $(GPU_CHECK_ARGS)
