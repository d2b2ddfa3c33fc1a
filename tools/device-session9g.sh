# Device run (H200), session 9: the TurboQuant writer's OR of code words over 4 / 8 lanes straight-line (write_tq.wgsl
# or4 / or8) instead of a loop naga bounds, against the kernel before (tools/ab-old3), twice each, interleaved; then
# the TurboQuant suites.
# tools/ab-old3 (not committed) held commit 0cc9e51's files, the A/B's old side; from a checkout: mkdir -p tools/ab-old3 &&
#   git show 0cc9e51:shaders/fast/write_tq.wgsl > tools/ab-old3/write_tq.wgsl
#   git show 0cc9e51:kvviz/kernels/fast_write_tq.py > tools/ab-old3/fast_write_tq.py
# The same A/B as tools/device-session9f.sh (the TurboQuant writer against tools/ab-old3), run again:
exec bash tools/device-session9f.sh
