// #include "common/quant.wgsl"
// f16 dequantise: expands the used blocks of the f16 cache (f16/write_fast.wgsl) into the f32 paged cache
// [num_blocks, kv_heads, block_size, head_size] (bound one window at a time: block - win0), exactly: the
// halves are widened on their bits (subnormal halves included, which unpack2x16float may flush).
// One 64-thread workgroup per (work item = used physical block, kv head, K|V).
@group(0) @binding(0) var<storage, read> k_cache: array<u32>;
@group(0) @binding(1) var<storage, read> v_cache: array<u32>;
@group(0) @binding(2) var<storage, read> items: array<vec4<u32>>;   // (physical block, seq, logical block, 0)
@group(0) @binding(3) var<storage, read_write> k_out: array<f32>;
@group(0) @binding(4) var<storage, read_write> v_out: array<f32>;
struct P { kvh: u32, hd: u32, bs: u32, wpt: u32, win0: u32 }
var<immediate> p: P;

fn load_w(which: u32, i: u32) -> u32 { if (which == 0u) { return k_cache[i]; } return v_cache[i]; }

// float16 bits -> float32 (exact).
fn f16_to_f32(h: u32) -> f32 {
  let sign = (h & 0x8000u) << 16u;
  let e = (h >> 10u) & 0x1Fu;
  let m = h & 0x3FFu;
  if (e == 0u) { return bitcast<f32>(sign | bitcast<u32>(ldexp(f32(m), -24))); }   // exact: m * 2^-24
  if (e == 31u) { return bitcast<f32>(sign | 0x7F800000u | (m << 13u)); }
  return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let blk = items[wg.x].x;
  let h = wg.y;
  let which = wg.z;
  let n = p.bs * p.hd;
  let out_base = ((blk - p.win0) * p.kvh + h) * n;
  let in_base = (blk * p.kvh + h) * p.bs * p.wpt;
  for (var i = lid.x; i < n; i = i + 64u) {
    let w = load_w(which, in_base + i / 2u);
    let v = f16_to_f32((w >> (16u * (i % 2u))) & 0xFFFFu);
    if (which == 0u) { k_out[out_base + i] = v; } else { v_out[out_base + i] = v; }
  }
}
