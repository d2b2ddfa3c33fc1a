// #include "ggml/common.wgsl"
// llama.cpp block-type dequantise into the f32 paged cache, type {{TYPE}} (see ggml_write.wgsl): each element by
// ggml/value.wgsl (gguf.quants.dequantize's arithmetic, bit-identical to gguf's values).
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
// #include "ggml/value.wgsl"

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
    let v = ggml_value(which, rec, d);
    if (which == 0u) { k_out[out_base + i] = v; } else { v_out[out_base + i] = v; }
  }
}
