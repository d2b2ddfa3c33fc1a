# Device run (H200): the fast decode's partition length and row groups a workgroup with the measured defaults
# (prefetch, the 2^23 int8 conversion) at the anchor (15 x 4096, 32/8 heads, d128, block 16, scattered).
source tools/device-env.sh
R=/tmp/r; mkdir -p $R
python3 tools/fast_decode_tune.py 15 4096 scattered int8,f16 --pt=0,256,512,2048 --rows=0,4,16 --budget=240 > $R/partitions.txt 2>&1; echo "rc=$?"
grep "^|" $R/partitions.txt
tar czf $OUT/r.tgz -C $R .
