# Device run (H200), session 12: can the anchor (15 x 4096) lose its reduce dispatch? The split alone and split +
# reduce at 1, 2 and 4 partitions a (sequence, KV head) (4096, 2048, 1024 tokens) with 8, 16 and 32 row groups,
# int8 (f32 query and the int8-query variant) and f16.
source tools/device-env.sh
timeout 280 python3 tools/fast_decode_tune.py 15 4096 scattered int8,f16 --split --rows=8,16,32 --pt=1024,2048,4096 2>&1 | tee "$OUT/p1-tune.txt" | grep -E "^(int8|f16|copy)"
timeout 200 python3 tools/fast_decode_tune.py 15 4096 scattered int8 --qk=i8 --split --rows=8,16,32 --pt=1024,2048,4096 2>&1 | tee "$OUT/p1-tune-i8.txt" | grep -E "^(int8|copy)"
