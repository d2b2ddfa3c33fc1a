// #include "common/quant.wgsl"
// int8_token dequantise: expands the used blocks of the int8 cache into the f32 paged cache
// [num_blocks, kv_heads, block_size, head_size] (bound one window at a time: block - win0).
// One 64-thread workgroup per (work item = used physical block, kv head, K|V).
@group(0) @binding(0) var<storage, read> k_cache: array<u32>;
@group(0) @binding(1) var<storage, read> v_cache: array<u32>;
@group(0) @binding(2) var<storage, read> items: array<vec4<u32>>;   // (physical block, seq, logical block, 0)
@group(0) @binding(3) var<storage, read_write> k_out: array<f32>;
@group(0) @binding(4) var<storage, read_write> v_out: array<f32>;
struct P { kvh: u32, hd: u32, bs: u32, wpt: u32, win0: u32 }
var<immediate> p: P;

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
    let code = extractBits(bitcast<i32>(load_w(which, rec + d / 4u)), 8u * (d % 4u), 8u);
    let v = f32(code) * bitcast<f32>(load_w(which, rec + p.hd / 4u));
    if (which == 0u) { k_out[out_base + i] = v; } else { v_out[out_base + i] = v; }
  }
}
