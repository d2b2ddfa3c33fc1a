// #include "common/quant.wgsl"
// #include "common/write_fast.wgsl"
// Fast KIVI token writer ({{BITS}}-bit), the words of kivi/write_tok.wgsl:
//  - residual row (row_res[t] != PAD_SLOT): K and V rows copied in f32 to res[row_res[t], 0|1, head, :];
//    the slot's K code words and V record are zeroed;
//  - quantised row: V asymmetric per token over the head vector (2^BITS-1 levels), record
//    [codes KW | scale | zero]; its K codes are written by kivi/write_kgroup_fast.wgsl.
// One lane group of L lanes per (token, KV head) row; a unit is one code word (CPW = 32/BITS elements,
// CPW/4 vec4s); lane l owns the units l + j*L, j < NJ = KW / L. Codes branch-free (asym_codes4_fast); a lane
// with an unsure code redoes its words exactly after the main loop. K buffer per (block, head): kstride words
// (bs*KW codes, then the side stream); V buffer per (block, head): bs*(KW+2) words. KW = hd*BITS/32.
@group(0) @binding(0) var<storage, read> key_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> val_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read> row_res: array<u32>;
@group(0) @binding(4) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<u32>;
@group(0) @binding(6) var<storage, read_write> res: array<vec4<f32>>;
struct P { kvh: u32, hd: u32, bs: u32, kstride: u32, rows: u32, gx: u32 }
var<immediate> p: P;
const BITS: u32 = {{BITS}}u;
const LEVELS: u32 = (1u << BITS) - 1u;
const CPW: u32 = 32u / BITS;
const VPU: u32 = CPW / 4u;   // vec4s a unit
const NJ: u32 = {{NJ}}u;
// PAD: the L lanes take NJ words each that cover more than the row's code words (kw words that no power of two <= L
// divides into few enough): a lane's words past the row are neither read nor written
const PAD: bool = {{PAD}};

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let row = (wg.y * p.gx + wg.x) * R + lid / L;
  let lane = lid % L;
  let live = row < p.rows;
  let nv4 = p.hd / 4u;
  let src = row * nv4;
  let kwr = p.hd * BITS / 32u;  // the row's code words
  var xv: array<vec4<f32>, NJ * VPU>;
  var m = vec2<u32>(0xFFFFFFFFu);
  // @unroll
  for (var j = 0u; j < NJ; j = j + 1u) {
    let in_row = !PAD || lane + j * L < kwr;
    // @unroll
    for (var i = 0u; i < VPU; i = i + 1u) {
      if (live && in_row) { xv[j * VPU + i] = val_in[src + (lane + j * L) * VPU + i]; }
      let a = minmax_keys4(xv[j * VPU + i]);
      if (in_row) { m = min(m, a); }
    }
  }
  m = red_min2(m, lid, L);
  if (!live) { return; }
  let t = row / p.kvh;
  let h = row % p.kvh;
  let slot = slots[t];
  if (slot == PAD_SLOT) { return; }
  let kw = p.hd * BITS / 32u;
  let kdst = ((slot / p.bs) * p.kvh + h) * p.kstride + (slot % p.bs) * kw;
  let vdst = ((slot / p.bs) * p.kvh + h) * p.bs * (kw + 2u) + (slot % p.bs) * (kw + 2u);
  let r = row_res[t];
  if (r != PAD_SLOT) {
    let rk = (r * 2u * p.kvh + h) * nv4;
    let rv = ((r * 2u + 1u) * p.kvh + h) * nv4;
    // @unroll
    for (var j = 0u; j < NJ; j = j + 1u) {
      if (!PAD || lane + j * L < kwr) {
        // @unroll
        for (var i = 0u; i < VPU; i = i + 1u) {
          let e = (lane + j * L) * VPU + i;
          res[rk + e] = key_in[src + e];
          res[rv + e] = xv[j * VPU + i];
        }
        k_cache[kdst + lane + j * L] = 0u;
        v_cache[vdst + lane + j * L] = 0u;
      }
    }
    if (lane == 0u) {
      v_cache[vdst + kw] = 0u;
      v_cache[vdst + kw + 1u] = 0u;
    }
    return;
  }
  let mn = bitcast<f32>(key_bits(m.x));
  let scale = asym_scale_fast(mn, bitcast<f32>(key_bits(~m.y)), LEVELS);
  let inv = select(0.0, approx_inv(scale), scale != 0.0);
  var sure = true;
  // @unroll
  for (var j = 0u; j < NJ; j = j + 1u) {
    if (!PAD || lane + j * L < kwr) {
      var word = 0u;
      // @unroll
      for (var i = 0u; i < VPU; i = i + 1u) {
        let c = asym_codes4_fast(xv[j * VPU + i], mn, scale, inv, LEVELS);
        word = word | pack_codes4(c.c, BITS, i);
        sure = sure && c.sure;
      }
      v_cache[vdst + lane + j * L] = word;
    }
  }
  if (!sure) {
    // rare (a quotient within 16 ulp of a rounding boundary, a subnormal value): the lane's words again, exactly,
    // reloaded (a loop: one copy of the exact path)
    for (var j = 0u; j < NJ; j = j + 1u) {
      if (PAD && lane + j * L >= kwr) { continue; }
      var word = 0u;
      for (var i = 0u; i < VPU; i = i + 1u) {
        word = word | pack_codes4(asym_codes4(val_in[src + (lane + j * L) * VPU + i], mn, scale, inv, LEVELS), BITS, i);
      }
      v_cache[vdst + lane + j * L] = word;
    }
  }
  if (lane == 0u) {
    v_cache[vdst + kw] = bitcast<u32>(scale);
    v_cache[vdst + kw + 1u] = bitcast<u32>(mn);
  }
}
