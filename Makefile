# Two commands do everything: `make run` and `make test`. Each installs what it needs and is
# quick when it is already there (apt only for missing packages; the venv is rebuilt when
# pyproject.toml changes).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.kvviz-stamp

# Debian packages: Vulkan loader + lavapipe (software Vulkan), Qt's runtime libraries, Xvfb for
# screenshots and headless runs.
APT_PKGS := libvulkan1 mesa-vulkan-drivers libgl1 libegl1 libglib2.0-0 libfontconfig1 \
  libxkbcommon0 libxkbcommon-x11-0 libdbus-1-3 libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 \
  libxcb-shape0 libxcb-xinerama0 libxcb-randr0 libxcb-render-util0 libxcb-image0 libxcb-xkb1 \
  libxrender1 libxi6 libsm6 libice6 libx11-xcb1 fonts-dejavu-core xvfb xauth

.PHONY: run test setup system venv bench clean

setup: system venv

# Checked every time (dpkg-query, well under a second): apt runs only for what is missing.
system:
	@bash tools/install-system.sh $(APT_PKGS)

venv: $(STAMP)
$(STAMP): pyproject.toml setup.py
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[dev]'
	@bash tools/install-model.sh $(VPY)
	@touch $@

run: setup
	@bash tools/launch.sh $(VPY) $(ARGS)

test: setup
	XDG_RUNTIME_DIR=$${XDG_RUNTIME_DIR:-/tmp} $(VPY) -m pytest -n auto --dist worksteal $(PYTEST_ARGS)

bench: setup
	$(VPY) -m kvviz bench --quick

clean:
	rm -rf $(VENV) build *.egg-info
