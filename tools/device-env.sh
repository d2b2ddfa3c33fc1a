# Sourced on the lent GPU machine (after ../shared/tools/device-prep.sh): kvviz's environment there.
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 XDG_CACHE_HOME=/tmp/kvviz-cache
[ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# A/B helpers for the device scripts: ab_save FILE... keeps this checkout's copies (the new side) in /tmp/new;
# ab_use DIR FILE... puts DIR's copies of those files in their places (DIR: /tmp/new, or a folder with the old side).
ab_save() { mkdir -p /tmp/new; cp "$@" /tmp/new/; }
ab_use() { local d=$1 f; shift; for f in "$@"; do cp "$d/$(basename "$f")" "$f"; done; }
