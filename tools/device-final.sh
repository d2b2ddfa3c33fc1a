# Device run (H200): the anchor bench (seed, first-wave, fast, f16, torch, user kernels: tools/device-check.sh
# anchor-core), the KIVI and q8_0 benches (end-to-end checked), the other ggml types' kernels timed, and the
# new fast decodes' conformance suites.
source tools/device-env.sh
bash tools/device-check.sh anchor-core > /tmp/core.log 2>&1; echo "anchor-core rc=$?"
KVVIZ_METHODS="kivi q8_0" KVVIZ_METHOD_TIMEOUT=110 bash tools/device-check.sh anchor-methods 2>&1 | grep "rc="
timeout 100 python3 tools/time_method_kernels.py q4_0 q4_1 q5_0 q5_1 iq4_nl mxfp4 "kivi:bits=4,recent=0" > "$OUT/ggml-kivi-kernels.txt" 2>&1; echo "kernels rc=$?"
timeout 120 python3 -m pytest tests/test_fast_decode_kivi.py tests/test_fast_decode_ggml.py tests/test_fast_decode.py -q -p no:cacheprovider 2>&1 | tail -2 | tee "$OUT/fast-conformance.txt"
grep -E "fast|torch|user" "$OUT/anchor-core.txt" | cut -c1-60,160-210
for m in kivi q8_0; do grep -E "fast_decode|dequant|paged_attn_f32|writer" "$OUT/anchor-$m.txt" | cut -c1-60,160-210; done
cat "$OUT/ggml-kivi-kernels.txt" | tail -40
