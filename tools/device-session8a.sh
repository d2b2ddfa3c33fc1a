# Device run (H200), session 8: the lazy scatter softmax (fast_decode.LAZY_TAU: an owner moves its max only past
# the old one + 8, the accumulators rescaled in one subgroup-uniform branch) against the eager one, for the
# per-token formats, 2 and 4 tokens a row per step, f32 and int8 query; then q8_0's roundf variant (Q8_TRUNC)
# against the default and KIVI's writer dispatch by dispatch.
source tools/device-env.sh
t=$(date +%s); timeout 330 python3 tools/fast_decode_tune.py 15 4096 scattered int8,f16,int4,fp8_e4m3 --qk=f32,i8 --unroll=2,4 --lazy=off,on --budget=270 > "$OUT/lazy.txt" 2>&1; echo "lazy rc=$? $(( $(date +%s) - t )) s"
grep -E "^\||copy shader" "$OUT/lazy.txt"
t=$(date +%s); timeout 110 python3 tools/fast_write_bench.py --methods=q8_0,kivi --per-dispatch > "$OUT/w-base.txt" 2>&1; echo "writers rc=$? $(( $(date +%s) - t )) s"
t=$(date +%s); timeout 80 python3 tools/fast_write_bench.py --methods=q8_0 --q8-trunc > "$OUT/w-trunc.txt" 2>&1; echo "trunc rc=$? $(( $(date +%s) - t )) s"
for f in w-base w-trunc; do echo "== $f"; grep -E "copy shader|\[fast\]|^  [0-9]:" "$OUT/$f.txt" | sed -E 's/^(.{0,60}).*(  [0-9.]+ us .*) \(gpu.*/\1 \2/'; done
