# Two user commands. Each does its own set-up from a fresh clone.
#   make demo   - the main job: FP4 vs FP8 vs exact indexer scoring on real text
#   make test   - the CPU test suite (Triton kernels under TRITON_INTERPRET=1)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[sglang,test,demo,plot]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/sglang-fp4-indexer demo $(ARGS)

test: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m pytest -q $(ARGS)
