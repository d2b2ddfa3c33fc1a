# Device run (H200), session 10: the query slices in workgroup memory (fast_decode.QSHARED, --qshared=on) against
# registers, for the exact int8, f16 and int4 decodes at 4, 5 and 6 partitions (tools/device-session10b.sh showed an SM
# holds 4 of the decode's workgroups: 5 partitions, 600 workgroups, took 120.1 us against 4's 92.4), twice, interleaved.
# --qshared was an experimental flag of tools/fast_decode_tune.py; the variant measured slower and was removed before
# commit, so this script no longer runs as it did (fast_decode.py records the figures).
source tools/device-env.sh
T=tools/fast_decode_tune.py
for pass in 1 2; do
  for v in off on; do
    timeout 140 python3 $T 15 4096 scattered int8,f16,int4 --split --qshared=$v --pt=1024,832,688 > /tmp/qs-$v-$pass.txt 2>&1; echo "qshared $v $pass rc=$?"
    grep -E "^(int8|f16|int4) " /tmp/qs-$v-$pass.txt | sed "s/^/$v $pass: /"
  done
done
