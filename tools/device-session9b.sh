# Device run (H200), session 9: where the KIVI key-group writer's time goes. Row sets 2 / 4 / 8 (--kgroup-rs), then
# three diagnostics on scratch copies of the shader (sed, this machine only; the words are then wrong, so only the
# timings mean anything): no side-word stores, no code-word stores, the rows' key loads without the grows lookup.
source tools/device-env.sh
K=shaders/fast/write_kivi_kgroup.wgsl; cp $K /tmp/kg.wgsl
run() { timeout 100 python3 tools/fast_write_bench.py --methods=kivi --per-dispatch "$2" > "$OUT/kg-$1.txt" 2>&1; echo "$1 rc=$?";
        grep -E "copy shader|\[fast\]|^  [0-9]: fast" "$OUT/kg-$1.txt" | sed -E 's/^(.{0,50}).*(  [0-9.]+ us .*) \(gpu.*/\1 \2/'; }
for pass in 1 2; do
  for rs in 4 2 8; do run rs$rs-$pass --kgroup-rs=$rs; done
done
sed -i 's/^      k_cache\[side_word.*$//' $K; grep -c side_word $K; run noside --x; cp /tmp/kg.wgsl $K
sed -i 's/^    k_cache\[((slot \/ p.bs).*$/    if (word == 0x12345678u) { k_cache[slot] = word; }/' $K; grep -n "12345678" $K; run nostore --x; cp /tmp/kg.wgsl $K
sed -i 's/xs\[j\] = key_in\[(grows\[gi \* 32u + rs + RS \* j\]/xs[j] = key_in[((gi * 32u + rs + RS * j)/' $K; grep -n "xs\[j\] = key_in" $K; run nogrows --x; cp /tmp/kg.wgsl $K
