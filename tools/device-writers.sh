# Device run (H200): the int8 seed-layout fast writer in its variants (lanes, reductions) at the anchor.
source tools/device-env.sh
R=/tmp/r; mkdir -p $R
python3 tools/fast_write_bench.py --only=seed > $R/writers.txt 2>&1; echo "writers rc=$?"
cat $R/writers.txt
tar czf $OUT/r.tgz -C $R .
