# Device run (H200), session 13: (1) can kvviz reach the tensor cores through wgpu (tools/coop_matrix_probe.py);
# (2) the fast decode's fixed cost: 512 workgroups (16 sequences x 8 KV heads x 4 partitions) of 1, 16 and 64 steps
# (partitions of 16, 256 and 1024 tokens), split alone and with the reduce: time = fixed + steps x per-step.
source tools/device-env.sh
timeout 60 python3 tools/coop_matrix_probe.py 2>&1 | tee "$OUT/coop-probe.txt"
for st in "64 16" "1024 256" "4096 1024"; do
  set -- $st
  timeout 150 python3 tools/fast_decode_tune.py 16 $1 scattered int8,f16 --pt=$2 --split 2>&1 | tail -8
done 2>&1 | tee "$OUT/fixed-cost.txt"
