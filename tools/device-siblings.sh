# Device run (H200): the KIVI and llama.cpp fast decodes after the constant block size (KIVI) and the prefetch
# (ggml, then KIVI: its on / off rows in kivi-prefetch.txt) at the anchor, timed beside their first-wave decodes,
# then their conformance suites.
source tools/device-env.sh
timeout 150 python3 tools/time_method_kernels.py q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl mxfp4 kivi "kivi:bits=4,recent=0" > "$OUT/siblings.txt" 2>&1; echo "kernels rc=$?"
# the KIVI fast decode's software-pipelined loads: its default, forced off, forced on (bit-identical outputs)
timeout 150 python3 tools/kivi_prefetch_time.py > "$OUT/kivi-prefetch.txt" 2>&1; echo "kivi prefetch rc=$?"
timeout 100 python3 -m pytest tests/test_fast_decode_kivi.py tests/test_fast_decode_ggml.py -q -p no:cacheprovider 2>&1 | tail -2 | tee "$OUT/siblings-conformance.txt"
grep -E "fast_decode|copy" "$OUT/siblings.txt"
cat "$OUT/kivi-prefetch.txt"
