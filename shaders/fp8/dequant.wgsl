// #include "common/quant.wgsl"
// FP8 ({{NAME}}) dequantise into the f32 paged cache: value = fp8_to_f32(code) * scale, scale from the
// record (per_token) or tensor[2|3] (per_tensor). Grid and items as in int8_dequant.wgsl.
@group(0) @binding(0) var<storage, read> k_cache: array<u32>;
@group(0) @binding(1) var<storage, read> v_cache: array<u32>;
@group(0) @binding(2) var<storage, read> tensor: array<u32>;
@group(0) @binding(3) var<storage, read> items: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> k_out: array<f32>;
@group(0) @binding(5) var<storage, read_write> v_out: array<f32>;
struct P { kvh: u32, hd: u32, bs: u32, wpt: u32, win0: u32 }
var<immediate> p: P;
const PER_TENSOR: bool = {{PER_TENSOR}};

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
    let code = extractBits(load_w(which, rec + d / 4u), 8u * (d % 4u), 8u);
    var scale_bits = tensor[2u + which];
    if (!PER_TENSOR) { scale_bits = load_w(which, rec + p.hd / 4u); }
    let v = fp8_to_f32(code, {{MBITS}}u, {{BIAS}}) * bitcast<f32>(scale_bits);
    if (which == 0u) { k_out[out_base + i] = v; } else { v_out[out_base + i] = v; }
  }
}
