# Device run (H200), 2026-12-01 (session 6): every fast writer at the anchor in the default variant (8 lanes a row
# through workgroup memory on NVIDIA, whose reported smallest subgroup is 4), with 4 lanes through subgroup shuffles
# (--auto=4, what wgpu guarantees) and with 8 lanes through shuffles assuming the real subgroup of 32 (--auto=8sg);
# then the writers' conformance suites on the H200 (the iq4_nl writer's new table search and division included).
source tools/device-env.sh
for v in default 4 8sg; do
  t=$(date +%s); a=""; [ "$v" != default ] && a="--auto=$v"
  timeout 150 python3 tools/fast_write_bench.py $a > "$OUT/writers-$v.txt" 2>&1; echo "writers $v rc=$? $(( $(date +%s) - t )) s"
done
t=$(date +%s)
timeout 200 python3 -m pytest tests/test_fast_writers.py tests/test_fast_write_ggml.py tests/test_fast_write_tq.py -q -p no:cacheprovider 2>&1 | tail -3 > "$OUT/conformance-writers.txt"
echo "conformance rc=$? $(( $(date +%s) - t )) s"; cat "$OUT/conformance-writers.txt"
paste <(grep -E "fast|seed" "$OUT/writers-default.txt" | cut -c1-62,63-75) <(grep -E "fast|seed" "$OUT/writers-4.txt" | cut -c63-75) <(grep -E "fast|seed" "$OUT/writers-8sg.txt" | cut -c63-75)
