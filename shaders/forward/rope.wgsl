// RoPE of one chunk of T tokens and the store of its keys and values (kvviz/forward/kernels.py).
// qkv [T, ld]: a token's nq query heads, then nkv key heads, then nkv value heads, D floats each. The query and key
// heads are rotated in place with the tables cos, sin [T, R/2] (R = rot, the rotated dims: tables at 0 and T*R/2);
// with store = 1 the rotated keys and the values also go to the layer's cache [cap, nkv, D] at position start + t.
// mode 0: rotate-half (the pairs (i, i + R/2), Hugging Face / NeoX); mode 1: interleaved (the pairs (2i, 2i + 1),
// GGML's normal mode). Dims from R on (partial rotary) stay as they are.
//   y0 = x0 * c - x1 * s,  y1 = x1 * c + x0 * s
// (the numpy forward: x * cos + rotate(x) * sin, each product rounded; a compiler may fuse one product into the
// sum: at most one rounding apart).
// Unit u < T * (nq + 2 nkv) * D/2: token t, head hh, pair i; 256 units a workgroup, workgroup (gx, gy) takes units
// from (gy * gx + gx_index) * 256.
@group(0) @binding(0) var<storage, read_write> qkv: array<f32>;
@group(0) @binding(1) var<storage, read> tables: array<f32>;
@group(0) @binding(2) var<storage, read_write> kc: array<f32>;
@group(0) @binding(3) var<storage, read_write> vc: array<f32>;
struct P { t: u32, nq: u32, nkv: u32, d: u32, rot: u32, ld: u32, start: u32, cap: u32, mode: u32, store: u32, gx: u32 }
var<immediate> p: P;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let u = (wid.y * p.gx + wid.x) * 256u + li;
  let half = p.d / 2u;
  let heads = p.nq + 2u * p.nkv;
  if (u >= p.t * heads * half) { return; }
  let i = u % half;
  let hh = (u / half) % heads;
  let t = u / (half * heads);
  let rh = p.rot / 2u;
  var e0 = 2u * i;
  var e1 = 2u * i + 1u;
  if (i < rh && p.mode == 0u) {
    e0 = i;
    e1 = i + rh;
  }
  let base = t * p.ld + hh * p.d;
  var y0 = qkv[base + e0];
  var y1 = qkv[base + e1];
  if (hh < p.nq + p.nkv && i < rh) {
    let c = tables[t * rh + i];
    let s = tables[p.t * rh + t * rh + i];
    let x0 = y0;
    let x1 = y1;
    y0 = x0 * c - x1 * s;
    y1 = x1 * c + x0 * s;
    qkv[base + e0] = y0;
    qkv[base + e1] = y1;
  }
  if (p.store != 0u && hh >= p.nq) {
    let kv = (hh - p.nq) % p.nkv;
    let cb = ((p.start + t) * p.nkv + kv) * p.d;
    if (hh < p.nq + p.nkv) {
      kc[cb + e0] = y0;
      kc[cb + e1] = y1;
    } else {
      vc[cb + e0] = y0;
      vc[cb + e1] = y1;
    }
  }
}
