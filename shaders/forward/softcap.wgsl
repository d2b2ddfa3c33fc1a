// Soft-capping in place (kvviz/forward/kernels.py): v = cap * tanh(v / cap), the argument clamped to [-15, 15]
// (tanh is 1 in f32 from 9.02 on). Element e < n, 256 a workgroup, workgroup (gx, gy) from (gy * gx + gx_index) * 256.
@group(0) @binding(0) var<storage, read_write> buf: array<f32>;
struct P { n: u32, gx: u32, cap: f32 }
var<immediate> p: P;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let e = (wid.y * p.gx + wid.x) * 256u + li;
  if (e >= p.n) { return; }
  buf[e] = p.cap * tanh(clamp(buf[e] / p.cap, -15.0, 15.0));
}
