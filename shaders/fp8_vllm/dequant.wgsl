// #include "common/quant.wgsl"
// vLLM-style FP8 dequantise into the f32 paged cache: value = fp8_to_f32(code) * scales[which * kvh + g]
// (g = h per head, 0 per tensor; one float32 multiply). Grid (work items, kv_heads, 2 = K|V) as in
// int8_dequant.wgsl: items[i].x is a physical block; the f32 cache is bound from block win0.
@group(0) @binding(0) var<storage, read> k_cache: array<u32>;
@group(0) @binding(1) var<storage, read> v_cache: array<u32>;
@group(0) @binding(2) var<storage, read> scales: array<u32>;
@group(0) @binding(3) var<storage, read> items: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> k_out: array<f32>;
@group(0) @binding(5) var<storage, read_write> v_out: array<f32>;
struct P { kvh: u32, hd: u32, bs: u32, wpt: u32, win0: u32, mbits: u32, bias: u32, per_head: u32 }
var<immediate> p: P;

fn load_w(which: u32, i: u32) -> u32 { if (which == 0u) { return k_cache[i]; } return v_cache[i]; }

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let blk = items[wg.x].x;
  let h = wg.y;
  let which = wg.z;
  let n = p.bs * p.hd;
  let out_base = ((blk - p.win0) * p.kvh + h) * n;
  let g = select(0u, h, p.per_head != 0u);
  let scale = bitcast<f32>(scales[which * p.kvh + g]);
  for (var i = lid.x; i < n; i = i + 64u) {
    let off = i / p.hd;
    let d = i % p.hd;
    let rec = ((blk * p.kvh + h) * p.bs + off) * p.wpt;
    let code = extractBits(load_w(which, rec + d / 4u), 8u * (d % 4u), 8u);
    let v = fp8_to_f32(code, p.mbits, i32(p.bias)) * scale;
    if (which == 0u) { k_out[out_base + i] = v; } else { v_out[out_base + i] = v; }
  }
}
