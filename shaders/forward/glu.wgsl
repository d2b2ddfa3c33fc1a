// Gated linear unit of the feed-forward block (kvviz/forward/kernels.py): gu [T, 2F] holds a token's gate (columns
// 0..F) and up (F..2F) projections;  out[t, f] = act(gate) * up, in f32 in the numpy forward's order:
//   act 0, SiLU:        x * (0.5 * (1 + tanh(0.5 * x)))
//   act 1, GELU (tanh): (0.5 * x) * (1 + tanh(0.7978845608 * (x + 0.044715 * x^3)))
// tanh of an argument clamped to [-15, 15] (tanh is 1 in f32 from 9.02 on; the clamp keeps a driver's
// exp-based tanh from overflowing).
// Element e < T * F, 256 a workgroup, workgroup (gx, gy) takes elements from (gy * gx + gx_index) * 256.
@group(0) @binding(0) var<storage, read> gu: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
struct P { t: u32, f: u32, act: u32, gx: u32 }
var<immediate> p: P;

fn tanh_c(x: f32) -> f32 { return tanh(clamp(x, -15.0, 15.0)); }

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let e = (wid.y * p.gx + wid.x) * 256u + li;
  if (e >= p.t * p.f) { return; }
  let t = e / p.f;
  let f = e % p.f;
  let g = gu[t * 2u * p.f + f];
  let up = gu[t * 2u * p.f + p.f + f];
  var a: f32;
  if (p.act == 0u) {
    a = g * (0.5 * (1.0 + tanh_c(0.5 * g)));
  } else {
    a = (0.5 * g) * (1.0 + tanh_c(0.7978845608 * (g + 0.044715 * (g * g * g))));
  }
  out[e] = a * up;
}
