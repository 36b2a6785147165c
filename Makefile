# Two user commands. Each does its own set-up from a fresh clone.
#   make demo   - the main job: FP4 vs FP8 vs exact indexer scoring on real text
#   make test   - the CPU test suite (Triton kernels under TRITON_INTERPRET=1)
# and one for installing elsewhere:
#   make wheel  - build dist/sglang_fp4_indexer-VERSION-py3-none-any.whl (the package is not on PyPI)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DIST   ?= dist

.PHONY: demo test venv wheel

# VENV=/path/to/a/venv with SGLang 0.5.23 in it: that environment is used as it is (not created again, its pip not
# upgraded); only this package and its extras are installed into it.
$(STAMP): pyproject.toml
	@if [ -x $(PY) ]; then \
	  echo "Using the existing $(VENV)/: installing this package and its extras into it."; \
	else \
	  echo "Setting up $(VENV)/: SGLang 0.5.23 with its dependencies (torch, CUDA libraries) and this package."; \
	  echo "This downloads several GB and takes 6-10 minutes; $(VENV)/ ends at about 11 GB."; \
	  $(PYTHON) -m venv $(VENV) && $(PY) -m pip install --upgrade pip; \
	fi
	$(PY) -m pip install --progress-bar on -e '.[sglang,test,demo,plot,model]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/sglang-fp4-indexer demo $(ARGS)

test: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m pytest -q $(ARGS)

wheel:
	$(PYTHON) -m pip wheel --no-deps -w $(DIST) .
	@echo "Install it next to SGLang 0.5.23: pip install '$$(ls -t $(DIST)/sglang_fp4_indexer-*.whl | head -1)[sglang]'"
