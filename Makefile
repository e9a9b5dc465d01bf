# Two entry points: `make demo` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.korch-installed
CHROMIUM := /usr/bin/chromium
SUDO     := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: demo test venv clean

venv: $(STAMP)

# torch is pinned and installed first: any looser request lets pip fetch a
# newer build with gigabytes of CUDA packages.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	# onnx2torch gives `korch bench` its torch peers for ONNX files; without --no-deps it pulls
	# torchvision, whose PyPI wheel is a CUDA build that asks for another torch (korch needs none of it)
	$(PY) -m pip install -q --no-deps 'onnx2torch>=1.5'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/korch zoo export candy $(VENV)/demo/candy.onnx
	$(VENV)/bin/korch inspect $(VENV)/demo/candy.onnx
	$(VENV)/bin/korch fission $(VENV)/demo/candy.onnx $(VENV)/demo/candy.primitives.onnx
	$(VENV)/bin/korch optimize $(VENV)/demo/candy.onnx --target cpu --cost roofline -o $(VENV)/demo/candy
	$(VENV)/bin/korch run $(VENV)/demo/candy --check
	$(VENV)/bin/korch bench $(VENV)/demo/candy.onnx --target cpu --cost roofline --against eager,compile,ort -o $(VENV)/demo/candy
	$(VENV)/bin/korch optimize zoo:bert_layer --target cpu --cost measured --db $(VENV)/demo/profile.sqlite -o $(VENV)/demo/bert
	$(VENV)/bin/korch run $(VENV)/demo/bert --check

test: $(STAMP) $(CHROMIUM)
	$(PY) -m pytest -q -n 2 tests

# The HTML report's test renders the page in headless Chromium (Debian's package).
$(CHROMIUM):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null

clean:
	rm -rf $(VENV) build src/*.egg-info
