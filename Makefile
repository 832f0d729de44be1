# One Makefile for people, CI and hooks. `make install` builds .venv/ at the repo root.
PY ?= python3
VENV := .venv
# torch is not pinned by the package; this picks the build to install. 2.14.1 + torchvision 0.29.1
# lie on the CI machines' disk (a CUDA build that also runs on the CPU).
TORCH ?= torch==2.14.1 torchvision==0.29.1
EXTRAS ?= vision,nlp,dev,xla,ray

.PHONY: install test lint format clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q $(TORCH)
	$(VENV)/bin/pip install -q -e '.[$(EXTRAS)]'
	touch $@

install: $(VENV)/.installed

# Two workers, each test file whole on one (its module fixtures shared): most of the suite's
# time is end-to-end tunes and benches that wait on their trial processes, so two workers on
# CI's 2 cores took 17 min where one took 28-34 (TEST_WORKERS=0: one process, no xdist).
TEST_WORKERS ?= 2
test: install
	$(VENV)/bin/python -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

lint: install
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

format: install
	$(VENV)/bin/ruff format src tests benchmarks
	$(VENV)/bin/ruff check --fix src tests benchmarks

clean:
	rm -rf $(VENV) kiln-runs .pytest_cache .ruff_cache
