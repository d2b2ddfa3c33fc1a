# Device run (H200), session 12: the NVFP4 writer at 4 (the default), 2 and 1 groups a lane (1 and 2: the scale words
# put together by subgroup shuffles; write_nvfp4.wgsl SUBW), each checked word for word against the oracle, two
# passes; the method's writer row beside them; then the NVFP4 writer tests on the H200.
source tools/device-env.sh
timeout 200 python3 tools/fast_write_bench.py 15 4096 --methods=nvfp4 --nvfp4-groups=4,2,1,4,2,1 2>&1 | grep -v "^the seed\|^fast int8\|^int8 seed" | tee "$OUT/nvfp4-groups.txt"
timeout 200 python3 -m pytest tests/test_fast_write_ggml.py -q -p no:cacheprovider -k nvfp4 2>&1 | tail -3 | tee "$OUT/nvfp4-tests.txt"
