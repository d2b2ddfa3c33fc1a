# Device run (H200), session 12: the NVFP4 writer with its new default (1 group a lane) against 4 groups, records staged
# through workgroup memory or stored in place, two passes; the methods' writer rows (nvfp4 at its default, mxfp4 beside
# it); then the llama.cpp / NVFP4 fast writer suite on the H200.
source tools/device-env.sh
timeout 200 python3 tools/fast_write_bench.py 15 4096 --methods=nvfp4,mxfp4 --nvfp4-groups=1,4,1,4 --nvfp4-stage=on,off 2>&1 | grep -v "^the seed\|^fast int8\|^int8 seed" | tee "$OUT/nvfp4-stage.txt"
timeout 250 python3 -m pytest tests/test_fast_write_ggml.py -q -p no:cacheprovider 2>&1 | tail -3 | tee "$OUT/writer-ggml-tests.txt"
