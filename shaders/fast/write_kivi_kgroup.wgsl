// #include "quant/common.wgsl"
// #include "fast/write_common.wgsl"
// Fast KIVI key-group writer ({{BITS}}-bit), the words of quant/kivi_write_kgroup.wgsl: keys quantised PER
// CHANNEL over a group of 32 consecutive positions [32g, 32g+32) of one sequence. The group's rows are read
// in place from the key input through their token-row indices (grows: 32 a group; nothing gathered on the
// host), so a group can be written when it fills (a live append) as well as in a prefill.
// One invocation per (group, KV head, code word w): it owns the CPW = 32/BITS channels of word w: min / max
// of each over the 32 rows, the (scale, zero) side words, then the 32 rows' code word w. No cross-lane
// reduction (LANES = {{LANES}} is unused here). Rows RU at a time (their loads issued together). Codes
// branch-free (round_mul4v); rows with an unsure code are redone exactly after the loop. Grid: 2-D over
// groups * kv_heads * KW invocations.
// groups[i] = (seq, g, 0, 0); info = [seq_info (4 words a sequence) | block tables (mbs words a sequence)].
// Side stream of a sequence (per kv head): word 2D*g + 2c = scale, 2D*g + 2c + 1 = zero of channel c, in
// logical block o / WS of the sequence at K-buffer word bs*KW + o % WS of that (block, head); WS = hd*bs/16.
@group(0) @binding(0) var<storage, read> key_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> slots: array<u32>;
@group(0) @binding(2) var<storage, read> grows: array<u32>;
@group(0) @binding(3) var<storage, read> groups: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> info: array<u32>;
@group(0) @binding(5) var<storage, read_write> k_cache: array<u32>;
struct P { kvh: u32, hd: u32, bs: u32, kstride: u32, bt_off: u32, mbs: u32, items: u32, gx: u32 }
var<immediate> p: P;
const BITS: u32 = {{BITS}}u;
const LEVELS: u32 = (1u << BITS) - 1u;
const CPW: u32 = 32u / BITS;
const VPU: u32 = CPW / 4u;
// rows a step of the row loops: 8 vec4s in flight for 4-bit (and 8-bit) codes; 2-bit codes keep one row a step:
// 2 rows of 4 vec4s measured slower on the H200 (tools/device-writers-7e.sh: 2-bit 378.9 -> 397.4 us, 4-bit at 4
// rows a step 343.6 -> 335.9)
const RU: u32 = 8u / VPU / (1u + VPU / 4u);   // VPU 1, 2, 4: 8, 4, 1 rows

fn side_word(seq: u32, h: u32, o: u32) -> u32 {
  let ws = p.hd * p.bs / 16u;
  let phys = info[p.bt_off + seq * p.mbs + o / ws];
  return (phys * p.kvh + h) * p.kstride + p.bs * (p.hd * BITS / 32u) + o % ws;
}

// The exact codes clamp(round(div_rn(x - z, s)), 0, LEVELS) of 4 channels (0 where s = 0).
fn exact_codes4(x: vec4<f32>, z: vec4<f32>, s: vec4<f32>) -> vec4<u32> {
  var c = vec4<u32>(0u);
  for (var l = 0u; l < 4u; l = l + 1u) {
    if (s[l] != 0.0) { c[l] = u32(clamp(round(div_rn(x[l] - z[l], s[l])), 0.0, f32(LEVELS))); }
  }
  return c;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let item = (wg.y * p.gx + wg.x) * WG + lid;
  if (item >= p.items) { return; }
  let kw = p.hd * BITS / 32u;
  let w = item % kw;
  let h = (item / kw) % p.kvh;
  let gi = item / (kw * p.kvh);
  let seq = groups[gi].x;
  let g = groups[gi].y;
  let nv4 = p.hd / 4u;
  var mn: array<vec4<u32>, VPU>;
  var mx: array<vec4<u32>, VPU>;
  // @unroll
  for (var i = 0u; i < VPU; i = i + 1u) {
    mn[i] = vec4<u32>(0xFFFFFFFFu);
    mx[i] = vec4<u32>(0u);
  }
  // RU rows a step, every load of the step issued before any arithmetic (the row loop is a runtime loop: without
  // this a lane waits on one row's index and then its vec4s at a time)
  for (var r0 = 0u; r0 < 32u; r0 = r0 + RU) {
    var xs: array<vec4<f32>, RU * VPU>;
    // @unroll
    for (var q = 0u; q < RU; q = q + 1u) {
      let src = (grows[gi * 32u + r0 + q] * p.kvh + h) * nv4 + w * VPU;
      // @unroll
      for (var i = 0u; i < VPU; i = i + 1u) { xs[q * VPU + i] = key_in[src + i]; }
    }
    // @unroll
    for (var q = 0u; q < RU; q = q + 1u) {
      // @unroll
      for (var i = 0u; i < VPU; i = i + 1u) {
        let u = bitcast<vec4<u32>>(xs[q * VPU + i]);
        let k = select(u | vec4<u32>(SIGN_BIT), ~u, (u & vec4<u32>(SIGN_BIT)) != vec4<u32>(0u));
        mn[i] = min(mn[i], k);
        mx[i] = max(mx[i], k);
      }
    }
  }
  var zero: array<vec4<f32>, VPU>;
  var scale: array<vec4<f32>, VPU>;
  var inv: array<vec4<f32>, VPU>;
  // @unroll
  for (var i = 0u; i < VPU; i = i + 1u) {
    // @unroll
    for (var l = 0u; l < 4u; l = l + 1u) {
      let z = bitcast<f32>(key_bits(mn[i][l]));
      let s = asym_scale_fast(z, bitcast<f32>(key_bits(mx[i][l])), LEVELS);
      zero[i][l] = z;
      scale[i][l] = s;
      inv[i][l] = select(0.0, approx_inv(s), s != 0.0);
      let o = 2u * p.hd * g + 2u * (w * CPW + 4u * i + l);
      k_cache[side_word(seq, h, o)] = bitcast<u32>(s);
      k_cache[side_word(seq, h, o + 1u)] = bitcast<u32>(z);
    }
  }
  var unsure = 0u;  // bit r: row r has a code round_mul4v is not sure of
  for (var r0 = 0u; r0 < 32u; r0 = r0 + RU) {
    var xs: array<vec4<f32>, RU * VPU>;
    var dst: array<u32, RU>;
    // @unroll
    for (var q = 0u; q < RU; q = q + 1u) {
      let tr = grows[gi * 32u + r0 + q];
      let src = (tr * p.kvh + h) * nv4 + w * VPU;
      let slot = slots[tr];
      dst[q] = ((slot / p.bs) * p.kvh + h) * p.kstride + (slot % p.bs) * kw + w;
      // @unroll
      for (var i = 0u; i < VPU; i = i + 1u) { xs[q * VPU + i] = key_in[src + i]; }
    }
    // @unroll
    for (var q = 0u; q < RU; q = q + 1u) {
      var word = 0u;
      var sure = true;
      // @unroll
      for (var i = 0u; i < VPU; i = i + 1u) {
        let r = round_mul4v(xs[q * VPU + i] - zero[i], inv[i]);
        let c = select(vec4<u32>(clamp(r.q, vec4<f32>(0.0), vec4<f32>(f32(LEVELS)))), vec4<u32>(0u), scale[i] == vec4<f32>(0.0));
        word = word | pack_codes4(c, BITS, i);
        sure = sure && r.sure;
      }
      k_cache[dst[q]] = word;
      unsure = unsure | select(1u << (r0 + q), 0u, sure);
    }
  }
  // rare (a quotient within 16 ulp of a rounding boundary, a subnormal value): those rows' words again, exactly
  // (a loop: one copy of the exact path; the channels' zero and scale picked by constant indices)
  for (var r = 0u; r < 32u; r = r + 1u) {
    if ((unsure & (1u << r)) == 0u) { continue; }
    let tr = grows[gi * 32u + r];
    let src = (tr * p.kvh + h) * nv4 + w * VPU;
    let slot = slots[tr];
    var word = 0u;
    for (var i = 0u; i < VPU; i = i + 1u) {
      var z = zero[0];
      var sc = scale[0];
      // @unroll
      for (var k = 0u; k < VPU; k = k + 1u) { if (i == k) { z = zero[k]; sc = scale[k]; } }
      word = word | pack_codes4(exact_codes4(key_in[src + i], z, sc), BITS, i);
    }
    k_cache[((slot / p.bs) * p.kvh + h) * p.kstride + (slot % p.bs) * kw + w] = word;
  }
}
