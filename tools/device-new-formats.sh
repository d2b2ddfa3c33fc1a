# Device run (H200): the seed-cache timing diagnostic, then the new formats' benches at the anchor shape (tarred: few files come back)
source tools/device-env.sh
R=/tmp/r; mkdir -p $R
timeout 90 python3 tools/diag_seed_cache.py > $R/diag_seed_cache.txt 2>&1; echo "diag rc=$?"
tail -12 $R/diag_seed_cache.txt
b() { s=$(date +%s); timeout "$1" python3 -m kvviz bench --shape decode-15x4096 --frontends glslang --methods "$2" --json "$R/anchor-$3.json" > "$R/anchor-$3.txt" 2>&1; echo "$3: rc=$? $(( $(date +%s) - s )) s"; }
b 200 q8_0,q4_0,q4_1,q5_0,q5_1,vllm_fp8_e4m3,vllm_fp8_e5m2 ggml-vllm
b 100 iq4_nl iq4_nl
b 100 turboquant turboquant
b 75 kivi kivi
tar czf $OUT/r.tgz -C $R .
