# Device run (H200), session 13: what the timing frame costs (tools/timing_frame.py): a near-empty kernel, the shader
# copy and the anchor's fast int8 / f16 decodes timed by the pass's timestamps (the product's frame), by timestamps
# inside the pass around the dispatches, and 16 to a pass.
source tools/device-env.sh
timeout 300 python3 tools/timing_frame.py 2>&1 | tee "$OUT/timing-frame.txt"
