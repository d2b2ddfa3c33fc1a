# Device run (H200): the reduce-scatter softmax (fast_decode.scatter_softmax) against the all-lane softmax, at
# the anchor (15 x 4096, 32/8 heads, d128, block 16, scattered), for the per-token formats, 2 and 4 tokens a
# row per step, and the int8-query variant.
source tools/device-env.sh
R=/tmp/r; mkdir -p $R
python3 tools/fast_decode_tune.py 15 4096 scattered int8,f16,int4,fp8_e4m3 --qk=f32,i8 --unroll=2,4 --scatter=off,on --split --budget=300 > $R/scatter.txt 2>&1; echo "rc=$?"
grep "^|" $R/scatter.txt
tar czf $OUT/r.tgz -C $R .
