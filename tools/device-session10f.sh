# Device run (H200), session 10: layouts with fewer registers a thread, so that an SM may hold more than 4 of the
# decode's workgroups (tools/device-session10b.sh): 32 lanes a row (half the query and accumulator registers of 16) and
# 1 token a row per step (half the prefetched words), each at 4 .. 8 partitions, for the exact int8 and f16 decodes.
source tools/device-env.sh
T=tools/fast_decode_tune.py
timeout 250 python3 $T 15 4096 scattered int8,f16 --split --lanes=16,32 --unroll=1,2 --pt=1024,832,688,512 --budget=220 > /tmp/lay.txt 2>&1; echo "layouts rc=$?"
grep -E "^(int8|f16) " /tmp/lay.txt
