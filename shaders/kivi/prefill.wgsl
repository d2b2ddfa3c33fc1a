// Causal (chunked) prefill attention over a KIVI cache read in place: keys quantised per channel over 32-token groups,
// values per token, the recent window in f32 rows; each value by the dequantiser's own element function
// (kivi/value.wgsl), the kernel attention/prefill_kernel.wgsl. The block tables are info's (bound as block_tables
// too, from word bt_off). kvviz/attention/prefill.py plans it; {{BITS}} bits.
@group(0) @binding(6) var<storage, read> res: array<f32>;
@group(0) @binding(7) var<storage, read> info: array<u32>;

const BITS: u32 = {{BITS}}u;
const KSTRIDE: u32 = {{KSTRIDE}}u;   // words of one (block, KV head) of K: its tokens' codes, then its side words

fn load_w(which: u32, i: u32) -> u32 { if (which == 0u) { return kc[i]; } return vc[i]; }
// #include "kivi/value.wgsl"

fn load4(which: u32, t: TokenAt, c: u32) -> vec4<f32> {
  let ks = KiviShape(p.num_kv_heads, D, BSZ, KSTRIDE, p.bt_off, p.max_blocks);
  let d = 4u * c;
  return vec4<f32>(kivi_value(ks, which, t.seq, t.phys, t.h, t.off, t.pos, d),
                   kivi_value(ks, which, t.seq, t.phys, t.h, t.off, t.pos, d + 1u),
                   kivi_value(ks, which, t.seq, t.phys, t.h, t.off, t.pos, d + 2u),
                   kivi_value(ks, which, t.seq, t.phys, t.h, t.off, t.pos, d + 3u));
}
fn load_k4(t: TokenAt, c: u32) -> vec4<f32> { return load4(0u, t, c); }
fn load_v4(t: TokenAt, c: u32) -> vec4<f32> { return load4(1u, t, c); }

// #include "attention/prefill_kernel.wgsl"
