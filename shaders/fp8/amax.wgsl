// #include "common/quant.wgsl"
// Per-tensor amax for the FP8 per_tensor mode: tensor[0] (K) / tensor[1] (V) = max |x| bits over every
// real (non-padding) row and head, by atomicMax on the bits (unsigned order = float order for |x|).
// tensor must be zeroed before the first chunk. Grid (rows, kv_heads, 2), 64 threads.
@group(0) @binding(0) var<storage, read> key_in: array<f32>;
@group(0) @binding(1) var<storage, read> val_in: array<f32>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read_write> tensor: array<atomic<u32>>;
struct P { kvh: u32, hd: u32, bs: u32, wpt: u32 }
var<immediate> p: P;
var<workgroup> s_red: array<u32, 64>;

fn load_x(which: u32, i: u32) -> f32 { if (which == 0u) { return key_in[i]; } return val_in[i]; }

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let t = wg.x;
  let which = wg.z;
  let tid = lid.x;
  let src = (t * p.kvh + wg.y) * p.hd;
  var m = 0u;
  for (var d = tid; d < p.hd; d = d + 64u) { m = max(m, bitcast<u32>(load_x(which, src + d)) & ABS_MASK); }
  s_red[tid] = m;
  workgroupBarrier();
  for (var s = 32u; s > 0u; s = s >> 1u) {
    if (tid < s) { s_red[tid] = max(s_red[tid], s_red[tid + s]); }
    workgroupBarrier();
  }
  if (tid == 0u && slots[t] != PAD_SLOT) { atomicMax(&tensor[which], s_red[0]); }
}
