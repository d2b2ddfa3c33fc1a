# Device run (H200), session 13: the timing floor as the product now measures it (each timed near-empty pass right
# after a pass of real work), beside tools/timing_frame.py's three frames; then the anchor bench without the methods'
# rows and the context and batch sweeps with that floor in the same run. The pass of real work before each timed floor pass
# did not change the floor (14.3 / 15.5 us in the bench processes, 7.0 / 7.2 in the sweeps') and was removed; the
# committed JSON is 13e's (assets/bench/h200-2026-12-02-*-13.json), this run's timing_frame.py output is in -fixed-cost-13.txt.
source tools/device-env.sh
timeout 120 python3 tools/timing_frame.py 2>&1 | tee "$OUT/timing-frame.txt"
bash tools/device-session13e.sh   # the anchor bench and the sweeps, as 13e ran them (it sources the environment again)
