// Tiled matrix multiply of the forward pass (kvviz/forward/kernels.py):
//   out[m, n_off + n] = sum_k x[m, k] * w[n, k]   (+ bias[n_off + n] when flags & 1) (+ out[m, n_off + n] when flags & 2)
// x: f32 activations [M, K]; w: one part of a weight matrix, N rows of K ([out, in], a Linear layer's layout), f32 or
// f16; f32 accumulation; out: f32 rows of ldo floats, this part's columns from n_off.
// A workgroup computes a BM x BN tile of out, each of its (BM/TM) x (BN/TN) threads TM x TN outputs: TM/4 groups of
// 4 rows spaced (BM/TM)*4 apart and TN/4 groups of 4 columns spaced (BN/TN)*4 apart, so a subgroup's reads of the
// shared tiles are broadcasts or consecutive vec4s. Per step of BK along K, the x and w tiles wait in workgroup
// memory transposed ([k][m], [k][n], a row padded by one vec4) and feed TM*TN/4 vec4 FMAs per k while the next
// step's tiles load into registers. Tails of M, N and K read zeros and write nothing.
// Tile {{BM}}x{{BN}}x{{BK}}, thread tile {{TM}}x{{TN}}.
@group(0) @binding(0) var<storage, read> x: array<{{XTYPE}}>;
@group(0) @binding(1) var<storage, read> w: array<{{WTYPE}}>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
struct P { m: u32, n: u32, k: u32, ldo: u32, n_off: u32, flags: u32, gx: u32 }
var<immediate> p: P;

const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const BK: u32 = {{BK}}u;
const TM: u32 = {{TM}}u;
const TN: u32 = {{TN}}u;
const TX: u32 = {{TX}}u;   // threads along n: BN / TN
const TY: u32 = {{TY}}u;   // threads along m: BM / TM
const NT: u32 = {{NT}}u;   // TX * TY
const RG: u32 = {{RG}}u;   // a thread's row groups: TM / 4
const CG: u32 = {{CG}}u;   // its column groups: TN / 4
const AC: u32 = {{AC}}u;   // its accumulators: TM * CG
const SA: u32 = {{SA}}u;   // vec4s of one k row of the x tile: BM / 4 + 1
const SB: u32 = {{SB}}u;   // of the w tile: BN / 4 + 1
const LA: u32 = {{LA}}u;   // vec4 loads of the x tile a thread: BM * BK / 4 / NT
const LB: u32 = {{LB}}u;   // of the w tile
const K4: u32 = {{K4}}u;   // vec4s along k of a tile row: BK / 4

var<workgroup> ta: array<vec4<f32>, {{TA}}>;
var<workgroup> tb: array<vec4<f32>, {{TB}}>;

{{LOADS}}

@compute @workgroup_size({{NT}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let tx = li % TX;
  let ty = li / TX;
  let m0 = wid.y * BM;
  let n0 = wid.x * BN;
  var acc: array<vec4<f32>, AC>;
  var ra: array<vec4<f32>, LA>;
  var rb: array<vec4<f32>, LB>;
  let steps = (p.k + BK - 1u) / BK;

  // @unroll
  for (var l = 0u; l < LA; l = l + 1u) {
    let e = li + l * NT;
    let row = m0 + e / K4;
    if (row < p.m) { ra[l] = xload(row, (e % K4) * 4u); } else { ra[l] = vec4<f32>(0.0); }
  }
  // @unroll
  for (var l = 0u; l < LB; l = l + 1u) {
    let e = li + l * NT;
    let row = n0 + e / K4;
    if (row < p.n) { rb[l] = wload(row, (e % K4) * 4u); } else { rb[l] = vec4<f32>(0.0); }
  }

  for (var s = 0u; s < steps; s = s + 1u) {
    // @unroll
    for (var l = 0u; l < LA; l = l + 1u) {
      let e = li + l * NT;
      let r = e / K4;
      let kk = (e % K4) * 4u;
      // @unroll
      for (var c = 0u; c < 4u; c = c + 1u) { ta[(kk + c) * SA + r / 4u][r % 4u] = ra[l][c]; }
    }
    // @unroll
    for (var l = 0u; l < LB; l = l + 1u) {
      let e = li + l * NT;
      let r = e / K4;
      let kk = (e % K4) * 4u;
      // @unroll
      for (var c = 0u; c < 4u; c = c + 1u) { tb[(kk + c) * SB + r / 4u][r % 4u] = rb[l][c]; }
    }
    workgroupBarrier();
    if (s + 1u < steps) {
      let k1 = (s + 1u) * BK;
      // @unroll
      for (var l = 0u; l < LA; l = l + 1u) {
        let e = li + l * NT;
        let row = m0 + e / K4;
        if (row < p.m) { ra[l] = xload(row, k1 + (e % K4) * 4u); }
      }
      // @unroll
      for (var l = 0u; l < LB; l = l + 1u) {
        let e = li + l * NT;
        let row = n0 + e / K4;
        if (row < p.n) { rb[l] = wload(row, k1 + (e % K4) * 4u); }
      }
    }
    // @unroll
    for (var kk = 0u; kk < BK; kk = kk + 1u) {
      var a: array<vec4<f32>, RG>;
      var b: array<vec4<f32>, CG>;
      // @unroll
      for (var i = 0u; i < RG; i = i + 1u) { a[i] = ta[kk * SA + i * TY + ty]; }
      // @unroll
      for (var j = 0u; j < CG; j = j + 1u) { b[j] = tb[kk * SB + j * TX + tx]; }
      // @unroll
      for (var i = 0u; i < RG; i = i + 1u) {
        // @unroll
        for (var r = 0u; r < 4u; r = r + 1u) {
          // @unroll
          for (var j = 0u; j < CG; j = j + 1u) {
            acc[(i * 4u + r) * CG + j] = fma(vec4<f32>(a[i][r]), b[j], acc[(i * 4u + r) * CG + j]);
          }
        }
      }
    }
    workgroupBarrier();
  }

  // @unroll
  for (var i = 0u; i < RG; i = i + 1u) {
    // @unroll
    for (var r = 0u; r < 4u; r = r + 1u) {
      let row = m0 + (i * TY + ty) * 4u + r;
      if (row < p.m) {
        // @unroll
        for (var j = 0u; j < CG; j = j + 1u) {
          // @unroll
          for (var c = 0u; c < 4u; c = c + 1u) {
            let col = n0 + (j * TX + tx) * 4u + c;
            if (col < p.n) {
              let o = row * p.ldo + p.n_off + col;
              var v = acc[(i * 4u + r) * CG + j][c];
              if ((p.flags & 1u) != 0u) { v = v + bias[p.n_off + col]; }
              if ((p.flags & 2u) != 0u) { v = out[o] + v; }
              out[o] = v;
            }
          }
        }
      }
    }
  }
}
