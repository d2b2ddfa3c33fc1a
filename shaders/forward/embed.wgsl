// Embedding lookup (kvviz/forward/kernels.py): out[t, c] = table[ids[t] - row0, c] * scale for the tokens whose id
// lies in this part of the table (rows row0..row0 + rows; a table larger than one storage binding comes in parts).
// table: f32, or f16 two a u32 word (the low half first), widened exactly. scale: 1, or the architecture's
// embedding scale (multiplied in f32 like the numpy forward).
// Element e < T * H, 256 a workgroup, workgroup (gx, gy) takes elements from (gy * gx + gx_index) * 256.
@group(0) @binding(0) var<storage, read> ids: array<u32>;
@group(0) @binding(1) var<storage, read> table: array<{{TTYPE}}>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
struct P { t: u32, h: u32, row0: u32, rows: u32, gx: u32, scale: f32 }
var<immediate> p: P;

fn tab(i: u32) -> f32 { return {{TAB}}; }

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let e = (wid.y * p.gx + wid.x) * 256u + li;
  if (e >= p.t * p.h) { return; }
  let t = e / p.h;
  let c = e % p.h;
  let id = ids[t];
  if (id < p.row0 || id >= p.row0 + p.rows) { return; }
  let v = tab((id - p.row0) * p.h + c);
  if (p.scale != 1.0) { out[e] = v * p.scale; } else { out[e] = v; }
}
