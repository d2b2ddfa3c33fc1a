// #include "ggml/common.wgsl"
// NVFP4 dequantise into the f32 paged cache (see nvfp4_write.wgsl): value = (e2m1 * e4m3) * s_t, the
// first product exact, the second one float32 multiply (kvviz/families/fp4/oracle.py). Grid and items as in
// int8/dequant.wgsl; s_t in tensor[2|3] (K|V).
@group(0) @binding(0) var<storage, read> k_cache: array<u32>;
@group(0) @binding(1) var<storage, read> v_cache: array<u32>;
@group(0) @binding(2) var<storage, read> tensor: array<u32>;
@group(0) @binding(3) var<storage, read> items: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> k_out: array<f32>;
@group(0) @binding(5) var<storage, read_write> v_out: array<f32>;
struct P { kvh: u32, hd: u32, bs: u32, wpt: u32, win0: u32 }
var<immediate> p: P;

fn load_w(which: u32, i: u32) -> u32 { if (which == 0u) { return k_cache[i]; } return v_cache[i]; }
fn rbyte(which: u32, rec: u32, b: u32) -> u32 { return (load_w(which, rec + b / 4u) >> (8u * (b % 4u))) & 0xFFu; }

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let blk = items[wg.x].x;
  let h = wg.y;
  let which = wg.z;
  let n = p.bs * p.hd;
  let out_base = ((blk - p.win0) * p.kvh + h) * n;
  let st = bitcast<f32>(tensor[2u + which]);
  let sw = (p.hd / 16u + 3u) / 4u;
  for (var i = lid.x; i < n; i = i + 64u) {
    let off = i / p.hd;
    let d = i % p.hd;
    let rec = ((blk * p.kvh + h) * p.bs + off) * p.wpt;
    let s = d / 16u;
    let j = d % 16u;
    let sc = fp8_to_f32(rbyte(which, rec, s), 3u, 7);
    let c = (rbyte(which, rec, 4u * sw + 8u * s + (j % 8u)) >> (4u * (j / 8u))) & 0xFu;
    let v = (e2m1_doubled(c) * 0.5 * sc) * st;
    if (which == 0u) { k_out[out_base + i] = v; } else { v_out[out_base + i] = v; }
  }
}
