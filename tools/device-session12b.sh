# Device run (H200), session 12: how many fast-decode split workgroups an SM holds (tools/residency_probe.py):
# equal-work workgroups (one partition of 1024 tokens each), their count stepped across multiples of 132.
source tools/device-env.sh
timeout 300 python3 tools/residency_probe.py 1024 int8,f16,i8q 2>&1 | tee "$OUT/residency.txt"
