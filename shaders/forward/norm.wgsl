// RMS norm of rows (kvviz/forward/kernels.py), in f32 in the numpy forward's order of operations:
//   y = (x * (1 / sqrt(sum(x^2) / n + eps))) * w
// the sum of squares summed in another order (128 strided partial sums, then halving in workgroup memory).
// Row r < rows: token t = r / per, part h = r % per (per > 1: the heads of a token, normed one by one with one weight
// w [n]); its n elements start at in_off + t * in_ld + h * n and go to out_off + t * out_ld + h * n.
// flags & 1: dst += y (a residual add after the norm); flags & 2: in place, reading dst (src is not read).
// Workgroup (gx, gy) takes row gy * gx + gx_index.
@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;
struct P { rows: u32, per: u32, n: u32, in_off: u32, in_ld: u32, out_off: u32, out_ld: u32, flags: u32, gx: u32, eps: f32 }
var<immediate> p: P;

const WG: u32 = 128u;
var<workgroup> red: array<f32, 128>;

fn load(i: u32) -> f32 {
  if ((p.flags & 2u) != 0u) { return dst[i]; }
  return src[i];
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let r = wid.y * p.gx + wid.x;
  if (r >= p.rows) { return; }
  let t = r / p.per;
  let h = r % p.per;
  let ib = p.in_off + t * p.in_ld + h * p.n;
  let ob = p.out_off + t * p.out_ld + h * p.n;
  var s = 0.0;
  for (var i = li; i < p.n; i = i + WG) {
    let v = load(ib + i);
    s = s + v * v;
  }
  red[li] = s;
  workgroupBarrier();
  for (var h2 = WG / 2u; h2 > 0u; h2 = h2 >> 1u) {
    if (li < h2) { red[li] = red[li] + red[li + h2]; }
    workgroupBarrier();
  }
  let inv = 1.0 / sqrt(red[0] / f32(p.n) + p.eps);
  for (var i = li; i < p.n; i = i + WG) {
    let y = (load(ib + i) * inv) * w[i];
    if ((p.flags & 1u) != 0u) { dst[ob + i] = dst[ob + i] + y; } else { dst[ob + i] = y; }
  }
}
