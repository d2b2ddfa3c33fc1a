# Device run (H200), session 8: the llama.cpp exchange writers with their records staged through workgroup memory
# (write_ggml.wgsl STAGE) against the in-place stores, twice each, interleaved; the lazy rescale of the int8 decode again.
source tools/device-env.sh
M=q8_0,q4_0,q5_0,iq4_nl,mxfp4
for pass in 1 2; do
  for v in stage no-stage; do
    f=""; [ $v = no-stage ] && f=--no-stage
    timeout 100 python3 tools/fast_write_bench.py --methods=$M $f > "$OUT/w-$v-$pass.txt" 2>&1; echo "$v $pass rc=$?"
    grep -E "copy shader|\[fast\]" "$OUT/w-$v-$pass.txt" | sed -E 's/^(.{0,40}).*(  [0-9.]+ us .*) \(gpu.*/\1 \2/'
  done
done
t=$(date +%s); timeout 200 python3 tools/fast_decode_tune.py 15 4096 scattered int8 --qk=f32,i8 --unroll=2,4 --lazy=off,on,off,on --split > "$OUT/lazy2.txt" 2>&1; echo "lazy rc=$? $(( $(date +%s) - t )) s"
grep -E "^\||copy shader" "$OUT/lazy2.txt"
