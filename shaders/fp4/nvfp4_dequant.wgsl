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
// #include "fp4/nvfp4_value.wgsl"

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let blk = items[wg.x].x;
  let h = wg.y;
  let which = wg.z;
  let n = p.bs * p.hd;
  let out_base = ((blk - p.win0) * p.kvh + h) * n;
  let st = bitcast<f32>(tensor[2u + which]);
  for (var i = lid.x; i < n; i = i + 64u) {
    let off = i / p.hd;
    let d = i % p.hd;
    let rec = ((blk * p.kvh + h) * p.bs + off) * p.wpt;
    let v = nvfp4_block_value(which, rec, d, p.hd) * st;
    if (which == 0u) { k_out[out_base + i] = v; } else { v_out[out_base + i] = v; }
  }
}
