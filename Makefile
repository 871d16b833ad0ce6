# The two entry points of the README. Both set up .venv first (once; again when pyproject changes):
# the quickstart installs what it runs, the tests add their tools on top.
VENV := .venv
PY := $(VENV)/bin/python
# `pip install`, done by uv where it can be: it unpacks the wheels in parallel (the script says why)
PIP := $(PY) scripts/venv_install.py
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev
# pytest worker processes (pytest-xdist; 0 runs the suite in this process): two fit the 2-core CI
TEST_WORKERS ?= 2

.PHONY: quickstart test setup rknn-venv

setup: $(DEV_STAMP)

# torch and torchvision are pinned as a pair: a plain `pip install torchvision` pulls another torch.
# One pip call for them and the project: one resolution, and the pins hold for both.
$(RUN_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q uv || echo "make: uv could not be installed; pip installs everything (slower)"
	# --no-compile: pip would byte-compile every module of every wheel (about a minute on 2 cores,
	# torch alone ~4000 files); Python compiles what is imported, once, on first use.
	$(PIP) install -q --no-compile torch==2.14.1 torchvision==0.29.1 -e ".[train,serve,tracking,cpu]"
	# `trackers` declares opencv-python, the GUI build, which needs libGL (absent on servers). Both
	# wheels ship the same cv2 module: keep only the headless one, so `import cv2` works everywhere.
	$(PIP) uninstall -q -y opencv-python
	$(PIP) install -q --no-compile --force-reinstall --no-deps "$$($(PY) -m pip freeze | grep -i '^opencv-python-headless==')"
	touch $@

# Only the dev extra: naming [tracking] again would bring opencv-python back through trackers.
$(DEV_STAMP): $(RUN_STAMP)
	# a current pip: the one a venv starts with (23.2 on Python 3.11) refuses the --platform dry runs
	# of scripts/check_installs.py
	$(PIP) install -q --no-compile --upgrade pip
	$(PIP) install -q --no-compile -e ".[dev]"
	# NVIDIA's TensorRT type stubs, for the type check of the TensorRT modules. --no-deps: the stubs
	# require the real tensorrt wheel, which needs NVIDIA's libraries and a GPU to be of any use.
	$(PIP) install -q --no-compile --no-deps tensorrt-stubs==10.13.0.35.1
	touch $@

# Rockchip's rknn-toolkit2 (the RKNN converter and its simulator) pins torch<=2.4.0, numpy<=1.26.4,
# onnx<=1.18.0 and protobuf<=4.25.4, which .venv's torch and numpy exclude: it gets a venv of its own,
# beside dfine-deploy's torch-free base, and `dfine-export --target rk3588` calls into it
# (docs/export.md: Rockchip NPUs). About 5.5 GB: PyPI's torch 2.4.0 is the CUDA build.
RKNN_VENV := .venv-rknn
RKNN_STAMP := $(RKNN_VENV)/.installed
RKNN_PIP := $(RKNN_VENV)/bin/python scripts/venv_install.py

rknn-venv: $(RKNN_STAMP)

$(RKNN_STAMP): pyproject.toml
	test -x $(RKNN_VENV)/bin/python || python3 -m venv $(RKNN_VENV)
	$(RKNN_VENV)/bin/python -m pip install -q uv || echo "make: uv could not be installed; pip installs everything (slower)"
	$(RKNN_PIP) install -q --no-compile "rknn-toolkit2==2.5.0" -e .
	# rknn-toolkit2 declares the GUI OpenCV too: keep only the headless one, as in .venv
	$(RKNN_PIP) uninstall -q -y opencv-python
	$(RKNN_PIP) install -q --no-compile --force-reinstall --no-deps "$$($(RKNN_VENV)/bin/python -m pip freeze | grep -i '^opencv-python-headless==')"
	touch $@

quickstart: $(RUN_STAMP)
	$(PY) scripts/quickstart.py $(ARGS)

test: $(DEV_STAMP) $(RKNN_STAMP)
	sh scripts/install-system-deps.sh
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(ARGS)
