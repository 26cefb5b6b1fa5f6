# Convolution kernels in CUDA: the workbook's commands (README.md explains them).
#
#   make book           build the website into _build/html (from the committed, GPU-executed notebooks)
#   make test           what CI runs: environment, exercise sync, nvcc check, site, browser, pytest, nbval (emulator)
#   make lab            JupyterLab at the project root, opened on exercises/ (as root too)
#   make gpu-run        on a GPU: execute book/ and solutions/ in place, refresh book/data/ and the README table
#   make kernels-check  compile every kernels/**/*.cu for sm_75, sm_80, sm_86, sm_89, sm_90 (no GPU needed)
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
# CPU-bound processes beside the notebook stage: `make test NOTEBOOK_LOAD=2` is the busy-machine
# check (a speed-dependent output fails under it); CI runs without, to stay within its time
NOTEBOOK_LOAD ?= 0

# Only the default interpreter depends on the venv; a given PYTHON is used as it is.
ifeq ($(PYTHON),$(VENV_PYTHON))
ENV_STAMP := $(VENV)/.installed
else
ENV_STAMP :=
endif

JUPYTER_BOOK := $(PYTHON) -c 'import sys; from jupyter_book.cli.main import main; sys.exit(main())'
NOTEBOOKS_RUN_ON_GPU = $(sort $(wildcard book/[0-9]*.ipynb solutions/[0-9]*.ipynb) book/gpu_numbers.ipynb)

.PHONY: venv test book chromium lab gpu-run kernels-check exercises exercises-check results-table clean

venv: $(VENV)/.installed

# torch first, pinned: pip takes the local CPU wheel, and the later `-e .` (torch unpinned) is
# then satisfied instead of pulling the newest CUDA build with several GB of packages.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV_PYTHON) -m pip install -q torch==2.13.0
	$(VENV_PYTHON) -m pip install -q -e '.[test,book]'
	touch $@

test: export CONVLAB_BACKEND = $(TEST_BACKEND)
test: export CONVLAB_PROGRESS = 0
test: $(ENV_STAMP)
	$(MAKE) --no-print-directory exercises-check
	@if [ -n "$(NVCC)" ]; then $(MAKE) --no-print-directory kernels-check; \
	 else echo "kernels-check skipped: no nvcc on this machine"; fi
	$(MAKE) --no-print-directory book
	$(MAKE) --no-print-directory chromium
	$(PYTHON) -m pytest -n $(JOBS) tests/
	$(PYTHON) scripts/busy.py $(NOTEBOOK_LOAD) -- \
	  $(PYTHON) -m pytest -n $(JOBS) --dist loadfile --nbval-lax book/ solutions/ exercises/ puzzles/

# MathJax for the site, served from its _static/mathjax (no CDN: the pages work offline). npm only
# downloads the package; the components the pages load are copied out of it (not the speech
# rules) into .mathjax/mathjax, which _config.yml adds to the static files. (The project has no
# _static/ folder: with one, Jupyter Book would load every .js file of every static folder on
# every page.)
MATHJAX_VERSION := 3.2.2
MATHJAX := .mathjax/mathjax/tex-mml-chtml.js

$(MATHJAX):
	@command -v npm >/dev/null || { echo "make book: npm is needed to fetch MathJax (apt-get install npm)"; exit 1; }
	rm -rf .mathjax && mkdir -p .mathjax/npm .mathjax/mathjax
	cd .mathjax/npm && npm pack --silent mathjax@$(MATHJAX_VERSION) >/dev/null && tar xzf mathjax-$(MATHJAX_VERSION).tgz
	cp -r .mathjax/npm/package/es5/{tex-mml-chtml.js,input,output,ui,a11y,adaptors} .mathjax/npm/package/LICENSE .mathjax/mathjax/
	rm -rf .mathjax/npm

book: $(ENV_STAMP) $(MATHJAX)
	$(JUPYTER_BOOK) build . --builder html -W -n --keep-going
	@echo "site: $(CURDIR)/_build/html/index.html"

# Headless Chromium for tests/test_site_browser.py, from Debian's packages, when missing and root
# (as in CI). Without it the browser test skips, except under CI, where it fails.
chromium:
	@if command -v chromium >/dev/null; then :; \
	 elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	   echo "installing chromium (apt-get) for the browser test"; \
	   apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	 else echo "no chromium and not root: the browser test will skip (sudo apt-get install chromium)"; fi

# JupyterLab at the project root (chapters, exercises, solutions, kernels all reachable), opened on
# exercises/. Root (as in containers) needs --allow-root; a user does not get it.
LAB_ROOT_FLAG = $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(ENV_STAMP)
	@$(PYTHON) -c 'import jupyterlab' 2>/dev/null || $(PYTHON) -m pip install -q -e '.[lab]'
	$(PYTHON) -m jupyterlab --ServerApp.root_dir="$(CURDIR)" --LabApp.default_url=/lab/tree/exercises $(LAB_ROOT_FLAG)

# No venv and no pip on this path: it must run with an offline Python (../shared/gpu-kit).
gpu-run: export CONVLAB_BACKEND = cuda
gpu-run: export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
gpu-run: $(ENV_STAMP)
	$(PYTHON) -c 'import convlab as cl; print("gpu-run on", cl.device())'
	rm -f book/data/torch.csv   # torch's rows of this run: each configuration timed afresh, once
	-$(PYTHON) benchmarks/gpu_numbers.py   # book/data/gpu_numbers.csv (book/gpu_numbers.ipynb's table); a failed check leaves none, the chapters still run
	$(PYTHON) scripts/execute_notebooks.py $(NOTEBOOKS_RUN_ON_GPU)
	$(PYTHON) scripts/results_table.py

kernels-check:
	@test -n "$(NVCC)" || { echo "kernels-check: nvcc not found"; exit 1; }
	python3 scripts/kernels_check.py --nvcc "$(NVCC)" --jobs $(JOBS)

exercises: $(ENV_STAMP)
	$(PYTHON) scripts/make_exercises.py

exercises-check: $(ENV_STAMP)
	$(PYTHON) scripts/make_exercises.py --check

results-table: $(ENV_STAMP)
	$(PYTHON) scripts/results_table.py

clean:
	rm -rf _build .pytest_cache .mathjax
