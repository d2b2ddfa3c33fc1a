// Fast TurboQuant writer (the seed configuration: 2-bit PolarQuant + 1-bit QJL keys, 2-bit PolarQuant values,
// head D = {{D}}): the per-token records of the PAGED cache that tq_general_compress.wgsl writes (K [polar D/16 |
// jl D/32 | norm], V [polar D/16 | norm] u32), bit for bit. kvviz/families/turboquant/writer.py renders it for one
// head size and lane count; the {{...}} blocks are generated there (straight-line code, no private arrays).
//
// One lane group of L = {{L}} lanes per (token, KV head) row, K and V together, R = 64 / L rows a workgroup;
// lane l holds the NJ = {{NJ}} vec4s l, l + L, ... of the row: element i = c + 4 l + 4 L j (c = 0..3).
// The arithmetic is tq_compress.wgsl's / the oracle's (kvviz/families/turboquant/oracle.py), op for op:
//   sum of squares: the tree with strides D/2, ..., 1 (the 128- and 256-lane trees add exact +0 before it):
//     its top bits are j (in-lane vec4 adds), then l (subgroupShuffleXor: every lane ends with lane 0's sum,
//     a + b = b + a exactly), then c: (s.x + s.z) + (s.y + s.w);
//   n = sqrt(sum); k = inv_sqrt_d / n; u = (x * k) * s_polar;
//   Walsh-Hadamard butterflies (a + b, a - b) at strides 1, 2 (c, in-lane), 4 .. 2L (l: the partner's value
//     by subgroupShuffleXor, the upper lane computing partner - own), 4L .. D/2 (j, in-lane);
//   index = number of boundaries <= y; r = y - c[index]; rn = sqrt(tree(r * r)); JL input (r / rn) * s_jl;
//   WHT; bit = (value >= 0); norm word pack2x16float(n, rn) (values (n, 0)); n < 1e-12: every word 0,
//   rn < 1e-12: JL words 0.
// inv_sqrt_d = f32(1/sqrt(D)) comes from the host at run time, as in the general compressor: with it a WGSL
// constant the H200's compiler divided differently (58 of ~11 M words at the anchor differed from
// tq_general_compress's); at run time every word agrees (assets/bench/h200-2026-12-01-tq-writer.txt).
// Squares pass through `opaque` (an OR with a zero the compiler cannot see) so no driver contracts the tree's
// first adds into FMAs: the workgroup-memory kernels store every square before adding it.
// Packing: a polar word is 4 lanes' bytes (OR over lane bits 0-1), a QJL word min(8, L) lanes' nibbles.
// Grid 2-D (workgroup y * gx + x), any number of rows in one dispatch; PAD_SLOT rows are skipped (their lanes
// still take part in the shuffles).
@group(0) @binding(0) var<storage, read> key_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> val_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read> signs: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<u32>;
struct P { kvh: u32, bs: u32, rows: u32, gx: u32, zero: u32, inv_sqrt_d: f32 }
var<immediate> p: P;

const WG: u32 = 64u;
const L: u32 = {{L}}u;
const R: u32 = WG / L;
const D: u32 = {{D}}u;
const WK: u32 = D / 16u + D / 32u + 1u;
const WV: u32 = D / 16u + 1u;
const EPS: f32 = 1e-12;
const PAD_SLOT: u32 = 0xFFFFFFFFu;
const CK: vec4<f32> = vec4<f32>({{CK}});
const BK: vec3<f32> = vec3<f32>({{BK}});
const CV: vec4<f32> = vec4<f32>({{CV}});
const BV: vec3<f32> = vec3<f32>({{BV}});

fn opaque(x: vec4<f32>) -> vec4<f32> { return bitcast<vec4<f32>>(bitcast<vec4<u32>>(x) | vec4<u32>(p.zero)); }

// The 2-bit code of y (the number of boundaries <= y; b ascending) and its centroid, from one set of compares: where
// y >= b.y, also y >= b.x. NaN: code 0, centroid c.x.
struct QC { q: vec4<u32>, c: vec4<f32> }
fn quant(y: vec4<f32>, b: vec3<f32>, c: vec4<f32>) -> QC {
  let g0 = y >= vec4<f32>(b.x);
  let g1 = y >= vec4<f32>(b.y);
  let g2 = y >= vec4<f32>(b.z);
  return QC(select(select(vec4<u32>(0u), vec4<u32>(1u), g0), select(vec4<u32>(2u), vec4<u32>(3u), g2), g1),
            select(select(vec4<f32>(c.x), vec4<f32>(c.y), g0), select(vec4<f32>(c.z), vec4<f32>(c.w), g2), g1));
}

// the butterflies of strides 1 and 2 (inside a vec4)
fn bfly12(v: vec4<f32>) -> vec4<f32> {
  let a = vec4<f32>(v.x + v.y, v.x - v.y, v.z + v.w, v.z - v.w);
  return vec4<f32>(a.x + a.z, a.y + a.w, a.x - a.z, a.y - a.w);
}

// the butterfly across lanes l and l ^ m (stride 4m): own + partner in the lower lane, partner - own in the upper, as
// one fma by +-1 (the product is exact, so the same single rounding as the add or subtract, not two ops and a select)
fn xbfly(v: vec4<f32>, m: u32, lane: u32) -> vec4<f32> {
  return fma(v, vec4<f32>(select(1.0, -1.0, (lane & m) != 0u)), subgroupShuffleXor(v, m));
}

// the tree's lane and c steps: every lane returns the row's sum
fn lane_sum(v: vec4<f32>) -> f32 {
  var s = v;
{{LANE_SUM}}
  return (s.x + s.z) + (s.y + s.w);
}

// OR over the aligned 4 / 8 lanes, straight-line (a loop over the lane bits stays a loop: naga bounds it)
fn or4(v: u32) -> u32 {
  let a = v | subgroupShuffleXor(v, 1u);
  return a | subgroupShuffleXor(a, 2u);
}
fn or8(v: u32) -> u32 {
  let a = or4(v);
  return a | subgroupShuffleXor(a, 4u);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let row = (wg.y * p.gx + wg.x) * R + lid / L;
  let lane = lid % L;
  let live = row < p.rows;
  let src = row * (D / 4u) + lane;
{{LOAD}}
  let t = select(0u, row / p.kvh, live);
  let h = row % p.kvh;
  let slot = slots[t];
  let store = live && slot != PAD_SLOT;
  let kdst = ((slot / p.bs) * p.kvh + h) * p.bs * WK + (slot % p.bs) * WK;
  let vdst = ((slot / p.bs) * p.kvh + h) * p.bs * WV + (slot % p.bs) * WV;
{{KEYS}}
{{VALUES}}
}
