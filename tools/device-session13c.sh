# Device run (H200), session 13: where the fast int8 decode's fixed cost goes (tools/decode_diag.py --fixed: the
# kernel as built, without its loop body, and empty) at 16 x 64 tokens (1 partition, 4 steps a workgroup) and at
# 16 x 4096 (4 partitions of 1024 tokens, the anchor's grid), two passes each.
source tools/device-env.sh
for ctx in 64 4096; do timeout 200 python3 tools/decode_diag.py 2 16 $ctx --fixed 2>&1 | grep -v "^ \|^$"; done | tee "$OUT/fixed-diag.txt"
