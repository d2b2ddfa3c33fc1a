// #include "ggml/common.wgsl"
// llama.cpp block-type dequantise into the f32 paged cache, type {{TYPE}} (see ggml_write.wgsl), as
// gguf.quants.dequantize computes it: every product d*q is exact in float32 (f16 d: 11 significant
// bits, q: at most 8), so the values are bit-identical to gguf's (a fused d*q + m is identical too).
// Grid (work items, kv heads, K|V); items and windows as in int8/dequant.wgsl.
@group(0) @binding(0) var<storage, read> k_cache: array<u32>;
@group(0) @binding(1) var<storage, read> v_cache: array<u32>;
@group(0) @binding(2) var<storage, read> items: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> k_out: array<f32>;
@group(0) @binding(4) var<storage, read_write> v_out: array<f32>;
struct P { kvh: u32, hd: u32, bs: u32, wpt: u32, win0: u32 }
var<immediate> p: P;

const TYPE: u32 = {{TYPE}}u;
const BPB: u32 = {{BPB}}u;
const HDR: u32 = {{HDR}}u;
const QH: u32 = {{QH}}u;

fn load_w(which: u32, i: u32) -> u32 { if (which == 0u) { return k_cache[i]; } return v_cache[i]; }
// byte `b` of the record starting at word `rec`
fn rbyte(which: u32, rec: u32, b: u32) -> u32 { return (load_w(which, rec + b / 4u) >> (8u * (b % 4u))) & 0xFFu; }
fn rhalf(which: u32, rec: u32, b: u32) -> u32 { return rbyte(which, rec, b) | (rbyte(which, rec, b + 1u) << 8u); }

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let blk = items[wg.x].x;
  let h = wg.y;
  let which = wg.z;
  let n = p.bs * p.hd;
  let out_base = ((blk - p.win0) * p.kvh + h) * n;
  for (var i = lid.x; i < n; i = i + 64u) {
    let off = i / p.hd;
    let d = i % p.hd;
    let rec = ((blk * p.kvh + h) * p.bs + off) * p.wpt;
    let b0 = (d / 32u) * BPB;   // first byte of the element's block
    let j = d % 32u;
    let qs = b0 + HDR + 4u * QH;
    var v = 0.0;
    if (TYPE == 0u) {
      let q = i32(rbyte(which, rec, qs + j) << 24u) >> 24u;
      v = f16_to_f32(rhalf(which, rec, b0)) * f32(q);
    } else {
      let nib = (rbyte(which, rec, qs + (j % 16u)) >> (4u * (j / 16u))) & 0xFu;
      var q = nib;
      if (QH == 1u) { q = q | (((rbyte(which, rec, b0 + HDR + j / 8u) >> (j % 8u)) & 1u) << 4u); }
      if (TYPE == 6u) {
        v = bitcast<f32>(e8m0_half_bits(rbyte(which, rec, b0))) * e2m1_doubled(q);
      } else {
        let sc = f16_to_f32(rhalf(which, rec, b0));
        if (TYPE == 1u) { v = sc * f32(i32(q) - 8); }
        else if (TYPE == 3u) { v = sc * f32(i32(q) - 16); }
        else if (TYPE == 5u) { v = sc * iq4nl_value(q); }
        else { v = sc * f32(q) + f16_to_f32(rhalf(which, rec, b0 + 2u)); }
      }
    }
    if (which == 0u) { k_out[out_base + i] = v; } else { v_out[out_base + i] = v; }
  }
}
