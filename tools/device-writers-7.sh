# Device run (H200), 2026-12-01 (session 7): every writer at the anchor in the default variant, after the per-row
# scales of the int8_token / int4 / KIVI writers moved to div_fast (not timed in session 6).
source tools/device-env.sh
t=$(date +%s); timeout 200 python3 tools/fast_write_bench.py > "$OUT/writers.txt" 2>&1; echo "writers rc=$? $(( $(date +%s) - t )) s"
grep -E "fast|seed|copy" "$OUT/writers.txt" | cut -c1-110
