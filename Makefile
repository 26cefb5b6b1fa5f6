# Convolution kernels in CUDA: the workbook's commands (README.md explains them).
#
#   make book           build the website into _build/html (from the committed, GPU-executed notebooks)
#   make test           what CI runs: environment, exercise sync, nvcc check, site, pytest, nbval (emulator)
#   make lab            JupyterLab on the exercises
#   make gpu-run        on a GPU: execute book/ and solutions/ in place, refresh book/data/ and the README table
#   make kernels-check  compile every kernels/**/*.cu with nvcc -ptx -arch=sm_90 (no GPU needed)
#   make exercises      regenerate exercises/ from solutions/
#
# PYTHON picks the interpreter. By default the targets make and use .venv; with an existing
# Python (for example on a GPU machine with no network: make gpu-run PYTHON=python3) no venv is
# made and nothing is installed.

SHELL := /bin/bash

VENV        := .venv
VENV_PYTHON := $(VENV)/bin/python
PYTHON      ?= $(VENV_PYTHON)
JOBS        ?= 2
NVCC        ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
TEST_BACKEND ?= emu

# Only the default interpreter depends on the venv; a given PYTHON is used as it is.
ifeq ($(PYTHON),$(VENV_PYTHON))
ENV_STAMP := $(VENV)/.installed
else
ENV_STAMP :=
endif

JUPYTER_BOOK := $(PYTHON) -c 'import sys; from jupyter_book.cli.main import main; sys.exit(main())'
NOTEBOOKS_RUN_ON_GPU = $(sort $(wildcard book/[0-9]*.ipynb solutions/[0-9]*.ipynb))
KERNEL_SOURCES = $(sort $(shell find kernels -name '*.cu' 2>/dev/null))

.PHONY: venv test book lab gpu-run kernels-check exercises exercises-check results-table clean

venv: $(VENV)/.installed

# torch first, pinned: pip takes the local CPU wheel, and the later `-e .` (torch unpinned) is
# then satisfied instead of pulling the newest CUDA build with several GB of packages.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV_PYTHON) -m pip install -q torch==2.13.0
	$(VENV_PYTHON) -m pip install -q -e '.[test,book]'
	touch $@

test: export CONVLAB_BACKEND = $(TEST_BACKEND)
test: $(ENV_STAMP)
	$(MAKE) --no-print-directory exercises-check
	@if [ -n "$(NVCC)" ]; then $(MAKE) --no-print-directory kernels-check; \
	 else echo "kernels-check skipped: no nvcc on this machine"; fi
	$(MAKE) --no-print-directory book
	$(PYTHON) -m pytest -n $(JOBS) tests/
	$(PYTHON) -m pytest -n $(JOBS) --dist loadfile --nbval-lax book/ solutions/ exercises/

book: $(ENV_STAMP)
	$(JUPYTER_BOOK) build . --builder html -W -n --keep-going
	@echo "site: $(CURDIR)/_build/html/index.html"

lab: $(ENV_STAMP)
	@$(PYTHON) -c 'import jupyterlab' 2>/dev/null || $(PYTHON) -m pip install -q jupyterlab
	$(PYTHON) -m jupyterlab --ServerApp.root_dir=exercises

# No venv and no pip on this path: it must run with an offline Python (../shared/gpu-kit).
gpu-run: export CONVLAB_BACKEND = cuda
gpu-run: export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
gpu-run: $(ENV_STAMP)
	$(PYTHON) -c 'import convlab as cl; print("gpu-run on", cl.device())'
	rm -f book/data/torch.csv   # torch's rows of this run: each configuration timed afresh, once
	$(PYTHON) scripts/execute_notebooks.py $(NOTEBOOKS_RUN_ON_GPU)
	$(PYTHON) scripts/results_table.py

kernels-check:
	@test -n "$(NVCC)" || { echo "kernels-check: nvcc not found"; exit 1; }
	@set -e; n=0; for f in $(KERNEL_SOURCES); do \
	  $(NVCC) -ptx -arch=sm_90 -Werror all-warnings -I kernels -o /dev/null "$$f"; n=$$((n+1)); \
	done; echo "kernels-check: $$n kernel files compile with nvcc -ptx -arch=sm_90, without a warning"

exercises: $(ENV_STAMP)
	$(PYTHON) scripts/make_exercises.py

exercises-check: $(ENV_STAMP)
	$(PYTHON) scripts/make_exercises.py --check

results-table: $(ENV_STAMP)
	$(PYTHON) scripts/results_table.py

clean:
	rm -rf _build .pytest_cache
