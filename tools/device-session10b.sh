# Device run (H200), session 10: the NVFP4 writer's staged-store loop unrolled (alone: its group loop unrolled too
# measured slower in tools/device-session10a.sh, 377 -> 455 us) against the kernel before (tools/ab-old10), and the
# block-table entries a step ahead for the f32 and FP8 caches (--bt-ahead=all against the default, which has them
# for f16 and int4 only), twice each, interleaved; the exact int8 and f16 decodes at 3 .. 6 partitions (how many
# workgroups an SM holds: a second wave shows as a jump); then the changed kernels' suites on the H200.
# tools/ab-old10 (not committed) held commit 3d0f93e's files, the old side; from a checkout: mkdir -p tools/ab-old10 &&
#   git show 3d0f93e:shaders/fast/write_nvfp4.wgsl > tools/ab-old10/write_nvfp4.wgsl
source tools/device-env.sh
F=shaders/fast/write_nvfp4.wgsl; cp $F /tmp/nv-new.wgsl
T=tools/fast_decode_tune.py
for pass in 1 2; do
  for v in new old; do
    if [ $v = old ]; then cp tools/ab-old10/write_nvfp4.wgsl $F; else cp /tmp/nv-new.wgsl $F; fi
    timeout 60 python3 tools/fast_write_bench.py --methods=nvfp4 --per-dispatch > /tmp/nv-$v-$pass.txt 2>&1; echo "nvfp4 $v $pass rc=$?"
    grep -E "copy shader|\[fast\]|^  [0-9]: fast" /tmp/nv-$v-$pass.txt | sed -E 's/^(.{0,50}).*(  [0-9.]+ us .*) \(gpu.*/\1 \2/' | sed "s/^/$v $pass: /"
  done
  for v in default all; do
    timeout 100 python3 $T 15 4096 scattered f32,fp8_e4m3 --split --bt-ahead=$v > /tmp/bt-$v-$pass.txt 2>&1; echo "bt $v $pass rc=$?"
    grep -E "^(f32|fp8_e4m3) " /tmp/bt-$v-$pass.txt | sed "s/^/$v $pass: /"
  done
done
cp /tmp/nv-new.wgsl $F
timeout 120 python3 $T 15 4096 scattered int8,f16 --split --pt=1376,1024,832,688 > /tmp/parts.txt 2>&1; echo "partitions rc=$?"
grep -E "^(int8|f16) " /tmp/parts.txt
t=$(date +%s); timeout 240 python3 -m pytest tests/test_fast_decode.py tests/test_fast_write_ggml.py tests/test_fast_decode_kivi.py -q -p no:cacheprovider 2>&1 | tail -2; echo "suites $(( $(date +%s) - t )) s"
