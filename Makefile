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

test: install
	$(VENV)/bin/python -m pytest -q

lint: install
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

format: install
	$(VENV)/bin/ruff format src tests benchmarks
	$(VENV)/bin/ruff check --fix src tests benchmarks

clean:
	rm -rf $(VENV) kiln-runs .pytest_cache .ruff_cache
