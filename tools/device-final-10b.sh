# Device run (H200), 2026-12-01 (session 10, final): the anchor bench again with the session's final code
# (tools/device-check.sh anchor-core: seed / fast / f16 / torch in one run, the README's decode table), then why
# tests/test_lab.py stopped at collection on this machine in session 9 (its collection alone).
source tools/device-env.sh
t=$(date +%s); timeout 240 bash tools/device-check.sh anchor-core > /tmp/core.log 2>&1; echo "anchor-core rc=$? $(( $(date +%s) - t )) s"
grep -E "^(kernel|copy_shader|fast_decode|torch|paged_attn_q8 )" "$OUT/anchor-core.txt" | cut -c1-60,150-200
timeout 60 python3 -m pytest tests/test_lab.py --collect-only -q -p no:cacheprovider 2>&1 | tail -25
