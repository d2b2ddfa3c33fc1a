// #include "common/quant.wgsl"
// int4_group dequantise into the f32 paged cache (see int8_dequant.wgsl for the grid and items).
@group(0) @binding(0) var<storage, read> k_cache: array<u32>;
@group(0) @binding(1) var<storage, read> v_cache: array<u32>;
@group(0) @binding(2) var<storage, read> items: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> k_out: array<f32>;
@group(0) @binding(4) var<storage, read_write> v_out: array<f32>;
struct P { kvh: u32, hd: u32, bs: u32, wpt: u32, win0: u32 }
var<immediate> p: P;
const G: u32 = {{GROUP}}u;

fn load_w(which: u32, i: u32) -> u32 { if (which == 0u) { return k_cache[i]; } return v_cache[i]; }

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
    let code = extractBits(load_w(which, rec + d / 8u), 4u * (d % 8u), 4u);
    let g = d / G;
    let scale = bitcast<f32>(load_w(which, rec + p.hd / 8u + 2u * g));
    let zero = bitcast<f32>(load_w(which, rec + p.hd / 8u + 2u * g + 1u));
    let v = f32(code) * scale + zero;
    if (which == 0u) { k_out[out_base + i] = v; } else { v_out[out_base + i] = v; }
  }
}
