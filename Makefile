# Two entry points: `make demo` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.korch-installed

.PHONY: demo test venv clean

venv: $(STAMP)

# torch is pinned and installed first: any looser request lets pip fetch a
# newer build with gigabytes of CUDA packages.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/korch zoo export candy $(VENV)/demo/candy.onnx
	$(VENV)/bin/korch inspect $(VENV)/demo/candy.onnx
	$(VENV)/bin/korch fission $(VENV)/demo/candy.onnx $(VENV)/demo/candy.primitives.onnx

test: $(STAMP)
	$(PY) -m pytest -q -n 2 tests

clean:
	rm -rf $(VENV) build src/*.egg-info
