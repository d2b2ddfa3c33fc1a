// Matrix times a few vectors (a decode step's M <= 8 rows; kvviz/forward/kernels.py), the same product as
// forward/matmul.wgsl:  out[m, n_off + n] = sum_k x[m, k] * w[n, k]  (+ bias[n_off + n]) (+ out[m, n_off + n]).
// Memory-bound on w: a workgroup of 256 threads takes ROWS = 8 consecutive rows n, 32 threads a row striding over K
// by 128 elements (one vec4 each: 512 contiguous bytes of an f32 row, 256 of an f16 row, a step), each thread
// keeping MR partial sums; the 32 partials of a (row, m) are summed in workgroup memory by halving.
// Workgroup (gx, gy): rows (gy * gx + gx_index) * 8.. (a 2-D grid when N / 8 passes the grid's limit). MR = {{MR}}.
@group(0) @binding(0) var<storage, read> x: array<{{XTYPE}}>;
@group(0) @binding(1) var<storage, read> w: array<{{WTYPE}}>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
struct P { m: u32, n: u32, k: u32, ldo: u32, n_off: u32, flags: u32, gx: u32 }
var<immediate> p: P;

const MR: u32 = {{MR}}u;
const ROWS: u32 = 8u;
const LANES: u32 = 32u;
var<workgroup> red: array<f32, {{RED}}>;

{{LOADS}}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let lane = li % LANES;
  let n = (wid.y * p.gx + wid.x) * ROWS + li / LANES;
  var s: array<f32, MR>;
  if (n < p.n) {
    for (var k = lane * 4u; k < p.k; k = k + LANES * 4u) {
      let wv = wload(n, k);
      // @unroll
      for (var m = 0u; m < MR; m = m + 1u) { s[m] = s[m] + dot(xload(m, k), wv); }
    }
  }
  // @unroll
  for (var m = 0u; m < MR; m = m + 1u) { red[m * 256u + li] = s[m]; }
  workgroupBarrier();
  for (var h = LANES / 2u; h > 0u; h = h >> 1u) {
    if (lane < h) {
      // @unroll
      for (var m = 0u; m < MR; m = m + 1u) { red[m * 256u + li] = red[m * 256u + li] + red[m * 256u + li + h]; }
    }
    workgroupBarrier();
  }
  if (lane == 0u && n < p.n) {
    // @unroll
    for (var m = 0u; m < MR; m = m + 1u) {
      let o = m * p.ldo + p.n_off + n;
      var v = red[m * 256u + li];
      if ((p.flags & 1u) != 0u) { v = v + bias[p.n_off + n]; }
      if ((p.flags & 2u) != 0u) { v = out[o] + v; }
      out[o] = v;
    }
  }
}
