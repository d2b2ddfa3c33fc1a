# Device run (H200): with the reduce-scatter softmax (the default), the per-token fast decode's layouts (lanes a
# row, tokens a row per step, row groups) for int8 (f32 and int8 query) and f16 at the anchor, then the KIVI and
# llama.cpp siblings timed beside their first-wave decodes (tools/time_method_kernels.py).
source tools/device-env.sh
R=/tmp/r; mkdir -p $R
python3 tools/fast_decode_tune.py 15 4096 scattered int8,f16 --qk=f32,i8 --lanes=8,16,32 --unroll=2,4 --rows=0,16 --split --budget=240 > $R/layouts.txt 2>&1; echo "tune rc=$?"
grep "^|" $R/layouts.txt
timeout 150 python3 tools/time_method_kernels.py q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl mxfp4 kivi "kivi:bits=4,recent=0" > $R/siblings.txt 2>&1; echo "kernels rc=$?"
grep -E "fast_decode|copy" $R/siblings.txt
tar czf $OUT/r.tgz -C $R .
