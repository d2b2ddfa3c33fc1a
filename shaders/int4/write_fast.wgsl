// #include "common/quant.wgsl"
// #include "common/write_fast.wgsl"
// Fast int4_group writer: the record of int4/write.wgsl (G = {{GROUP}}): words 0..hd/8-1 codes
// (element 8w+l in bits 4l..4l+3), then per group g: word hd/8+2g = scale bits, hd/8+2g+1 = zero (min).
// scale = (max-min)/15 (0 when max-min < 2^-100), code = clamp(round((x-min)/scale), 0, 15).
// One lane group of L lanes per (token, KV head) row, K and V together. A unit is one code word (8
// elements, 2 vec4s); lane l owns the units l + j*L, j < NJ = hd / (8L). A group is GU = G/8 units:
//   GU <= L: unit j of a lane lies in group (l + j*L) / GU, spread over GU aligned lanes: reduced over
//            a span of GU lanes (JG = 1 unit a group per lane);
//   GU >  L: a group is JG = GU / L consecutive j of every lane: combined in the lane, then over L lanes.
// Codes: branch-free (asym_codes4_fast); a lane with an unsure word redoes it exactly after the main loop.
@group(0) @binding(0) var<storage, read> key_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> val_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<u32>;
struct P { kvh: u32, hd: u32, bs: u32, wpt: u32, rows: u32, gx: u32 }
var<immediate> p: P;
const G: u32 = {{GROUP}}u;
const NJ: u32 = {{NJ}}u;
const GU: u32 = G / 8u;
const JG: u32 = max(GU / L, 1u);
const SPAN: u32 = min(GU, L);
const NK: u32 = NJ / JG;

fn pack8(a: vec4<u32>, b: vec4<u32>) -> u32 { return pack_codes4(a, 4u, 0u) | pack_codes4(b, 4u, 1u); }

// The exact code word of 8 values (asym_codes4: its fast path, else div_rn an element at a time).
fn word4(x0: vec4<f32>, x1: vec4<f32>, g: vec3<f32>) -> u32 {
  return pack8(asym_codes4(x0, g.x, g.y, g.z, 15u), asym_codes4(x1, g.x, g.y, g.z, 15u));
}

// (word, 1 when sure): the branch-free code word of the main loop (asym_codes4_fast).
fn word4_fast(x0: vec4<f32>, x1: vec4<f32>, g: vec3<f32>) -> vec2<u32> {
  let a = asym_codes4_fast(x0, g.x, g.y, g.z, 15u);
  let b = asym_codes4_fast(x1, g.x, g.y, g.z, 15u);
  return vec2<u32>(pack8(a.c, b.c), select(0u, 1u, a.sure && b.sure));
}

// (min, scale, 1 / scale or 0) of K (isv false) or V from a group's reduced keys s.
fn group_params(s: vec4<u32>, isv: bool) -> vec3<f32> {
  let mn = bitcast<f32>(key_bits(select(s.x, s.y, isv)));
  let sc = asym_scale_fast(mn, bitcast<f32>(key_bits(~select(s.z, s.w, isv))), 15u);
  return vec3<f32>(mn, sc, select(0.0, approx_inv(sc), sc != 0.0));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let row = (wg.y * p.gx + wg.x) * R + lid / L;
  let lane = lid % L;
  let live = row < p.rows;
  let src = row * (p.hd / 4u);
  var xk: array<vec4<f32>, 2 * NJ>;
  var xv: array<vec4<f32>, 2 * NJ>;
  var st: array<vec4<u32>, NK>;   // per group slot k: (min key K, min key V, ~max key K, ~max key V)
  // @unroll
  for (var k = 0u; k < NK; k = k + 1u) {
    var m = vec4<u32>(0xFFFFFFFFu);
    // @unroll
    for (var i = 0u; i < JG; i = i + 1u) {
      let j = k * JG + i;
      let u = lane + j * L;
      if (live) {
        xk[2u * j] = key_in[src + 2u * u];
        xk[2u * j + 1u] = key_in[src + 2u * u + 1u];
        xv[2u * j] = val_in[src + 2u * u];
        xv[2u * j + 1u] = val_in[src + 2u * u + 1u];
      }
      let a = minmax_keys4(xk[2u * j]);
      let b = minmax_keys4(xk[2u * j + 1u]);
      let c = minmax_keys4(xv[2u * j]);
      let d = minmax_keys4(xv[2u * j + 1u]);
      m = min(m, vec4<u32>(min(a.x, b.x), min(c.x, d.x), min(a.y, b.y), min(c.y, d.y)));
    }
    st[k] = red_min(m, lid, SPAN);
  }
  if (!live) { return; }
  let t = row / p.kvh;
  let h = row % p.kvh;
  let slot = slots[t];
  if (slot == PAD_SLOT) { return; }
  let dst = ((slot / p.bs) * p.kvh + h) * p.bs * p.wpt + (slot % p.bs) * p.wpt;
  let nw = p.hd / 8u;
  var sure = 1u;
  // @unroll
  for (var k = 0u; k < NK; k = k + 1u) {
    let gk = group_params(st[k], false);
    let gv = group_params(st[k], true);
    // @unroll
    for (var i = 0u; i < JG; i = i + 1u) {
      let j = k * JG + i;
      let u = lane + j * L;
      let wk = word4_fast(xk[2u * j], xk[2u * j + 1u], gk);
      let wv = word4_fast(xv[2u * j], xv[2u * j + 1u], gv);
      k_cache[dst + u] = wk.x;
      v_cache[dst + u] = wv.x;
      sure = sure & wk.y & wv.y;
    }
    let u0 = lane + k * JG * L;
    if (u0 % GU == 0u) {
      let g = u0 / GU;
      k_cache[dst + nw + 2u * g] = bitcast<u32>(gk.y);
      k_cache[dst + nw + 2u * g + 1u] = bitcast<u32>(gk.x);
      v_cache[dst + nw + 2u * g] = bitcast<u32>(gv.y);
      v_cache[dst + nw + 2u * g + 1u] = bitcast<u32>(gv.x);
    }
  }
  if (sure == 0u) {
    // rare (a quotient within 16 ulp of a rounding boundary, a subnormal value): the lane's unsure words again,
    // K then V, reloaded (a loop: one copy of the exact path; the group's keys picked by constant indices)
    for (var j = 0u; j < 2u * NJ; j = j + 1u) {
      let isv = j >= NJ;
      let jj = j % NJ;
      var s = st[0];
      // @unroll
      for (var k = 0u; k < NK; k = k + 1u) { if (jj / JG == k) { s = st[k]; } }
      let g = group_params(s, isv);
      let u = lane + jj * L;
      var x0: vec4<f32>;
      var x1: vec4<f32>;
      if (isv) { x0 = val_in[src + 2u * u]; x1 = val_in[src + 2u * u + 1u]; }
      else { x0 = key_in[src + 2u * u]; x1 = key_in[src + 2u * u + 1u]; }
      if (word4_fast(x0, x1, g).y == 1u) { continue; }
      let w = word4(x0, x1, g);
      if (isv) { v_cache[dst + u] = w; } else { k_cache[dst + u] = w; }
    }
  }
}
