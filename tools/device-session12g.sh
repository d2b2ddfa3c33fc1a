# Device run (H200), session 12: the NVFP4 writer at 1 group a lane stored in place (the default), K and V in one lane
# against on separate lanes (write_nvfp4.wgsl KVS), and 2 groups on separate lanes, two passes; the method's writer row at
# its default; then the llama.cpp / NVFP4 writer suite and the NVFP4 fast decode suite on the H200.
source tools/device-env.sh
timeout 200 python3 tools/fast_write_bench.py 15 4096 --methods=nvfp4 --nvfp4-groups=1,2,1,2 --nvfp4-stage=off --nvfp4-kvs=off,on 2>&1 | grep -v "^the seed\|^fast int8\|^int8 seed" | tee "$OUT/nvfp4-kvs.txt"
timeout 300 python3 -m pytest tests/test_fast_write_ggml.py tests/test_fast_decode_nvfp4.py -q -p no:cacheprovider 2>&1 | tail -3 | tee "$OUT/nvfp4-suites.txt"
