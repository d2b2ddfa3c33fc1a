# Device run (H200): the anchor bench of seed, fast, f16 and torch with two `kvviz kernel new` user kernels
# (the README's table and roofline), then the kernels of iq4_nl and TurboQuant's paper settings at the anchor.
source tools/device-env.sh
R=/tmp/r; mkdir -p $R
OUT=$R bash tools/device-check.sh anchor-core > $R/anchor-core.log 2>&1; echo "anchor-core rc=$?"
grep -E "^(fast_decode|paged_attn_q8|paged_attn_f16|torch|copy_shader|reshape_and_cache_q8)" $R/anchor-core.txt | cut -c1-60,180-250
timeout 240 python3 tools/time_method_kernels.py iq4_nl turboquant turboquant:bits=1,v_bits=1 turboquant:bits=3,v_bits=3 \
  turboquant:bits=4,v_bits=4 turboquant:bits=2,v_bits=2,outlier_share=0.5 turboquant:bits=3,v_bits=3,outlier_share=0.5 \
  > $R/method-kernels.txt 2>&1; echo "method kernels rc=$?"; cat $R/method-kernels.txt | tail -25
tar czf $OUT/r.tgz -C $R .
