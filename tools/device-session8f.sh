# Device run (H200), session 8: lanes a row for the FP8 per-tensor writer (no row reduction: any lane count is legal),
# dispatch by dispatch (--auto: 4 lanes by shuffles, 8 / 16 / 32 assuming the H200's 32-lane subgroups; the default
# is 8 lanes through workgroup memory); then the fast decode's partition length at the anchor for int8 and f16.
source tools/device-env.sh
for a in "" --auto=4 --auto=8sg --auto=16sg --auto=32sg; do
  timeout 60 python3 tools/fast_write_bench.py --methods=fp8_e4m3 --per-dispatch $a > "$OUT/fp8$a.txt" 2>&1; echo "fp8 $a rc=$?"
  grep -E "\[fast\]|^  [0-9]: fast" "$OUT/fp8$a.txt" | sed -E 's/^(.{0,50}).*(  [0-9.]+ us .*) \(gpu.*/\1 \2/'
done
timeout 150 python3 tools/fast_decode_tune.py 15 4096 scattered int8,f16 --pt=0,256,512,1024 --split > "$OUT/pt.txt" 2>&1; echo "pt rc=$?"
grep -E "^\||copy shader" "$OUT/pt.txt"
