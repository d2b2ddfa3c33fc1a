# Two commands do everything: `make run` and `make test`. Each installs what it needs and is
# quick when it is already there (stamp files record what was done).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.kvviz-stamp
SYS_STAMP := .deps/system-stamp

# Debian packages: Vulkan loader + lavapipe (software Vulkan), Qt's runtime libraries, Xvfb for
# screenshots and headless runs.
APT_PKGS := libvulkan1 mesa-vulkan-drivers libgl1 libegl1 libglib2.0-0 libfontconfig1 \
  libxkbcommon0 libxkbcommon-x11-0 libdbus-1-3 libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 \
  libxcb-shape0 libxcb-xinerama0 libxcb-randr0 libxcb-render-util0 libxcb-image0 libxcb-xkb1 \
  libxrender1 libxi6 libsm6 libice6 libx11-xcb1 xvfb xauth

.PHONY: run test setup system venv bench report clean

setup: system venv

system: $(SYS_STAMP)
$(SYS_STAMP):
	@bash tools/install-system.sh $(APT_PKGS)
	@mkdir -p .deps && touch $@

venv: $(STAMP)
$(STAMP): pyproject.toml
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[dev]'
	@bash tools/install-model.sh $(VPY)
	@touch $@

run: setup
	@bash tools/launch.sh $(VPY) $(ARGS)

test: setup
	XDG_RUNTIME_DIR=$${XDG_RUNTIME_DIR:-/tmp} $(VPY) -m pytest $(PYTEST_ARGS)

bench: setup
	$(VPY) -m kvviz bench --quick

clean:
	rm -rf $(VENV) .deps build *.egg-info
