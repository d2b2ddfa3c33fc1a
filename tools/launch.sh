#!/usr/bin/env bash
# `make run`: open the kvviz window on the synthetic default workload.
# Without a display (a server, CI, a container) it runs the same window under Xvfb, renders it to
# out/kvviz-window.png once the results are in, says so, and exits.
set -euo pipefail
VPY="$1"; shift || true
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/kvviz-runtime-$(id -u)}"
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
if [ -n "${DISPLAY:-}" ] || [ -n "${WAYLAND_DISPLAY:-}" ]; then
  exec "$VPY" main.py "$@"
fi
mkdir -p out
echo "kvviz: no display found; running the window under Xvfb and saving it to out/kvviz-window.png"
exec xvfb-run -a -s "-screen 0 1680x1050x24" "$VPY" main.py gui --screenshot out/kvviz-window.png "$@"
