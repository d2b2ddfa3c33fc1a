// #include "quant/common.wgsl"
// #include "fast/write_common.wgsl"
// Fast int4_group writer: the record of quant/int4_write.wgsl (G = {{GROUP}}): words 0..hd/8-1 codes
// (element 8w+l in bits 4l..4l+3), then per group g: word hd/8+2g = scale bits, hd/8+2g+1 = zero (min).
// scale = (max-min)/15 (0 when max-min < 2^-100), code = clamp(round((x-min)/scale), 0, 15).
// One lane group of L lanes per (token, KV head) row, K and V together. A unit is one code word (8
// elements, 2 vec4s); lane l owns the units l + j*L, j < NJ = hd / (8L). A group is GU = G/8 units:
//   GU <= L: unit j of a lane lies in group (l + j*L) / GU, spread over GU aligned lanes: reduced over
//            a span of GU lanes (JG = 1 unit a group per lane);
//   GU >  L: a group is JG = GU / L consecutive j of every lane: combined in the lane, then over L lanes.
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

fn word4(x0: vec4<f32>, x1: vec4<f32>, mn: f32, scale: f32, inv: f32) -> u32 {
  let a = asym_codes4(x0, mn, scale, inv, 15u);
  let b = asym_codes4(x1, mn, scale, inv, 15u);
  return a.x | (a.y << 4u) | (a.z << 8u) | (a.w << 12u) | (b.x << 16u) | (b.y << 20u) | (b.z << 24u) | (b.w << 28u);
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
  // @unroll
  for (var k = 0u; k < NK; k = k + 1u) {
    let s = st[k];
    let mnk = bitcast<f32>(key_bits(s.x));
    let mnv = bitcast<f32>(key_bits(s.y));
    let sck = asym_scale_fast(mnk, bitcast<f32>(key_bits(~s.z)), 15u);
    let scv = asym_scale_fast(mnv, bitcast<f32>(key_bits(~s.w)), 15u);
    let ik = select(0.0, approx_inv(sck), sck != 0.0);
    let iv = select(0.0, approx_inv(scv), scv != 0.0);
    // @unroll
    for (var i = 0u; i < JG; i = i + 1u) {
      let j = k * JG + i;
      let u = lane + j * L;
      k_cache[dst + u] = word4(xk[2u * j], xk[2u * j + 1u], mnk, sck, ik);
      v_cache[dst + u] = word4(xv[2u * j], xv[2u * j + 1u], mnv, scv, iv);
    }
    let u0 = lane + k * JG * L;
    if (u0 % GU == 0u) {
      let g = u0 / GU;
      k_cache[dst + nw + 2u * g] = bitcast<u32>(sck);
      k_cache[dst + nw + 2u * g + 1u] = bitcast<u32>(mnk);
      v_cache[dst + nw + 2u * g] = bitcast<u32>(scv);
      v_cache[dst + nw + 2u * g + 1u] = bitcast<u32>(mnv);
    }
  }
}
