# Device run (H200): the fast decode's variants (int8 query + dot4I8Packed, f16 P.V, runtime checks) at the anchor,
# then the fast decode conformance suites.
source tools/device-env.sh
R=/tmp/r; mkdir -p $R
python3 tools/fast_decode_tune.py 15 4096 scattered int8,f16 --variants --budget=150 > $R/variants.txt 2>&1; echo "variants rc=$?"
python3 tools/fast_decode_tune.py 15 4096 scattered int8,f16 --variants --lanes=8,32 --checks=off --budget=100 > $R/variants-lanes.txt 2>&1; echo "lanes rc=$?"
timeout 200 python3 -m pytest tests/test_fast_decode.py tests/test_fast_decode_variants.py -q -p no:cacheprovider 2>&1 | tail -5 > $R/conformance.txt; cat $R/conformance.txt
tar czf $OUT/r.tgz -C $R .
