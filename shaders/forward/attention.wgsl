// Causal attention of one chunk of T tokens over the layer's KV cache (kvviz/forward/kernels.py; the numpy forward's
// gqa_attention):  out[t, h] = sum_j softmax(s)_j v_j  over the positions j the query at position start + t sees:
// j <= start + t, and with a sliding window (window > 0) only start + t - j < window;  s_j = (q . k_j) * scale,
// soft-capped to softcap * tanh(s_j / softcap) when softcap > 0.
// q: the rotated query heads in qkv [T, ld] (head h at h * D); the cache [cap, nkv, D] (kvviz's forward cache);
// out [T, nq * D]. Query head h reads KV head h / (nq / nkv).
// A workgroup takes TQ tokens x GR query heads of one KV head (workgroup (x, y): tokens x * TQ.., KV head y / hb,
// heads (y % hb) * GR.. of its group); a row (token, head) is 4 lanes, lane l holding the vec4s l, l + 4, ... of D.
// Per tile of BC positions: the K and V rows in workgroup memory; a row's lanes add their partial dot products by
// subgroupShuffleXor; online softmax (a running max and sum per row, the accumulator rescaled once a tile).
// A driver running the pipeline with subgroups of fewer than 4 lanes, or a row's lanes not at the low bits of the
// subgroup, would add the wrong lanes: the row is then written as NaN (refused as non-finite, not wrong).
// D = {{D}}, TQ = {{TQ}}, GR = {{GR}}, BC = {{BC}}.
@group(0) @binding(0) var<storage, read> qkv: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> kc: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> vc: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;
struct P { t: u32, start: u32, nq: u32, nkv: u32, ld: u32, window: u32, hb: u32, scale: f32, softcap: f32 }
var<immediate> p: P;

const D: u32 = {{D}}u;
const D4: u32 = {{D4}}u;    // vec4s of a head
const DL4: u32 = {{DL4}}u;  // vec4s of a lane: D / 16
const TQ: u32 = {{TQ}}u;
const GR: u32 = {{GR}}u;
const BC: u32 = {{BC}}u;
const WG: u32 = {{WG}}u;    // TQ * GR * 4
const NEG: f32 = -3.402823466e38;
var<workgroup> ks: array<vec4<f32>, {{TILE}}>;
var<workgroup> vs: array<vec4<f32>, {{TILE}}>;

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32,
        @builtin(subgroup_size) sg_size: u32, @builtin(subgroup_invocation_id) sgi: u32) {
  let lane = li % 4u;
  let row = li / 4u;
  let g = row % GR;
  let kvh = wid.y / p.hb;
  let gi = (wid.y % p.hb) * GR + g;
  let group = p.nq / p.nkv;
  let h = kvh * group + gi;
  let t0 = wid.x * TQ;
  let t = t0 + row / GR;
  let live = t < p.t && gi < group;
  let pos = p.start + t;
  // the positions any row of the workgroup sees
  let hi = p.start + min(p.t, t0 + TQ);
  var lo = 0u;
  if (p.window > 0u && p.start + t0 + 1u > p.window) { lo = p.start + t0 + 1u - p.window; }
  // the positions this row sees
  let rhi = pos + 1u;
  var rlo = 0u;
  if (p.window > 0u && pos + 1u > p.window) { rlo = pos + 1u - p.window; }

  var qv: array<vec4<f32>, DL4>;
  if (live) {
    // @unroll
    for (var v = 0u; v < DL4; v = v + 1u) { qv[v] = qkv[(t * p.ld + h * D) / 4u + v * 4u + lane]; }
  }
  var m = NEG;
  var l = 0.0;
  var acc: array<vec4<f32>, DL4>;
  for (var j0 = lo; j0 < hi; j0 = j0 + BC) {
    workgroupBarrier();
    for (var e = li; e < BC * D4; e = e + WG) {
      let j = j0 + e / D4;
      if (j < hi) {
        let src = (j * p.nkv + kvh) * D4 + e % D4;
        ks[e] = kc[src];
        vs[e] = vc[src];
      } else {
        ks[e] = vec4<f32>(0.0);
        vs[e] = vec4<f32>(0.0);
      }
    }
    workgroupBarrier();
    var sc: array<f32, BC>;
    var mt = m;
    // @unroll
    for (var jj = 0u; jj < BC; jj = jj + 1u) {
      var d = 0.0;
      // @unroll
      for (var v = 0u; v < DL4; v = v + 1u) { d = d + dot(qv[v], ks[jj * D4 + v * 4u + lane]); }
      d = d + subgroupShuffleXor(d, 1u);
      d = d + subgroupShuffleXor(d, 2u);
      var s = d * p.scale;
      if (p.softcap > 0.0) { s = p.softcap * tanh(clamp(s / p.softcap, -15.0, 15.0)); }
      sc[jj] = s;
      let j = j0 + jj;
      if (j >= rlo && j < rhi) { mt = max(mt, s); }
    }
    let alpha = exp(m - mt);
    l = l * alpha;
    // @unroll
    for (var v = 0u; v < DL4; v = v + 1u) { acc[v] = acc[v] * alpha; }
    // @unroll
    for (var jj = 0u; jj < BC; jj = jj + 1u) {
      let j = j0 + jj;
      if (j >= rlo && j < rhi) {
        let pj = exp(sc[jj] - mt);
        l = l + pj;
        // @unroll
        for (var v = 0u; v < DL4; v = v + 1u) { acc[v] = fma(vec4<f32>(pj), vs[jj * D4 + v * 4u + lane], acc[v]); }
      }
    }
    m = mt;
  }
  if (live) {
    var inv = 1.0 / l;
    if (sg_size < 4u || (sgi & 3u) != lane) { inv = bitcast<f32>(0x7fc00000u); }
    // @unroll
    for (var v = 0u; v < DL4; v = v + 1u) { out[(t * p.nq + h) * D4 + v * 4u + lane] = acc[v] * inv; }
  }
}
