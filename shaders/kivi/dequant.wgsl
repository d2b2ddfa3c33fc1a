// #include "common/quant.wgsl"
// KIVI ({{BITS}}-bit) dequantise into the f32 paged cache. Grid (items, kv_heads, 2 = K|V), 64 threads;
// items[i] = (physical block, seq, logical block, 0). Position pos = logical*bs + offset:
//   pos >= context_len       : not written;
//   pos >= n_q (residual)    : the f32 row res[res_off + pos - n_q, K|V, head, :];
//   K, pos < n_q             : code * scale_c + zero_c of group pos/32 (side stream, see kivi_write_kgroup);
//   V, pos < n_q             : code * scale + zero of the token's record.
// info = [seq_info: (context_len, n_q, res_off, 0) per sequence | block tables].
@group(0) @binding(0) var<storage, read> k_cache: array<u32>;
@group(0) @binding(1) var<storage, read> v_cache: array<u32>;
@group(0) @binding(2) var<storage, read> res: array<f32>;
@group(0) @binding(3) var<storage, read> info: array<u32>;
@group(0) @binding(4) var<storage, read> items: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> k_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> v_out: array<f32>;
struct P { kvh: u32, hd: u32, bs: u32, kstride: u32, bt_off: u32, mbs: u32, win0: u32 }
var<immediate> p: P;
const BITS: u32 = {{BITS}}u;
const CPW: u32 = 32u / BITS;

fn side_word(seq: u32, h: u32, o: u32) -> u32 {
  let ws = p.hd * p.bs / 16u;
  let phys = info[p.bt_off + seq * p.mbs + o / ws];
  return (phys * p.kvh + h) * p.kstride + p.bs * (p.hd * BITS / 32u) + o % ws;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let item = items[wg.x];
  let blk = item.x;
  let seq = item.y;
  let lb = item.z;
  let h = wg.y;
  let which = wg.z;
  let ctx_len = info[seq * 4u];
  let n_q = info[seq * 4u + 1u];
  let res_off = info[seq * 4u + 2u];
  let kw = p.hd * BITS / 32u;
  let n = p.bs * p.hd;
  let out_base = ((blk - p.win0) * p.kvh + h) * n;
  for (var i = lid.x; i < n; i = i + 64u) {
    let off = i / p.hd;
    let c = i % p.hd;
    let pos = lb * p.bs + off;
    if (pos >= ctx_len) { continue; }
    var v: f32;
    if (pos >= n_q) {
      v = res[(((res_off + pos - n_q) * 2u + which) * p.kvh + h) * p.hd + c];
    } else if (which == 0u) {
      let word = k_cache[(blk * p.kvh + h) * p.kstride + off * kw + c / CPW];
      let code = extractBits(word, BITS * (c % CPW), BITS);
      let o = 2u * p.hd * (pos / 32u) + 2u * c;
      v = f32(code) * bitcast<f32>(k_cache[side_word(seq, h, o)]) + bitcast<f32>(k_cache[side_word(seq, h, o + 1u)]);
    } else {
      let rec = ((blk * p.kvh + h) * p.bs + off) * (kw + 2u);
      let code = extractBits(v_cache[rec + c / CPW], BITS * (c % CPW), BITS);
      v = f32(code) * bitcast<f32>(v_cache[rec + kw]) + bitcast<f32>(v_cache[rec + kw + 1u]);
    }
    if (which == 0u) { k_out[out_base + i] = v; } else { v_out[out_base + i] = v; }
  }
}
