# Device run (H200), session 12: the NVFP4 writer (1 group a lane, in place: the default) with s_t derived by every
# thread against once by its own one-invocation pass (write_nvfp4_scale.wgsl), two passes, each checked word for word;
# then the NVFP4 writer tests on the H200.
source tools/device-env.sh
timeout 150 python3 tools/fast_write_bench.py 15 4096 --methods=none --nvfp4-groups=1,1 --nvfp4-stage=off --nvfp4-scale-pass=off,on 2>&1 | grep -v "^the seed\|^fast int8\|^int8 seed" | tee "$OUT/nvfp4-scale-pass.txt"
timeout 120 python3 -m pytest tests/test_fast_write_ggml.py -q -p no:cacheprovider -k nvfp4 2>&1 | tail -2 | tee "$OUT/nvfp4-tests.txt"
