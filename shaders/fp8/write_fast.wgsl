// #include "common/quant.wgsl"
// #include "common/write_fast.wgsl"
// #include "common/write_redo.wgsl"
// Fast FP8 writer ({{NAME}}: {{MBITS}} mantissa bits, bias {{BIAS}}, max {{FMAX}}), the codes and scales of
// fp8/write.wgsl (saturating RNE of x / scale, scale floored at 2^-126). PER_TENSOR = {{PER_TENSOR}}:
//   false: scale = max(amax_token / FMAX, 2^-126) per (token, KV head), record [hd/4 code words | scale];
//   true : scale = max(amax_tensor / FMAX, 2^-126), amax_tensor in tensor[0|1] (K|V) from
//          fp8/amax_fast.wgsl; the first row stores the scale bits in tensor[2|3]; record = codes.
// One lane group of L lanes per (token, KV head) row, K and V together (see write_common.wgsl).
// Codes: every vec4 through fast_codes (branch-free: one encode of q = |x| * (1/scale) and a test, on the
// bits of q, that q is not within 16 ulp of an FP8 midpoint, nor an FP8 subnormal / zero, nor from a
// subnormal x); a lane with an unsure word redoes those words through the exact path `codes` (div_rn_bits
// where needed), so the words equal fp8/write.wgsl's. Scales: amax / FMAX by scale_bits (an integer
// division by 7, the same bits as div_rn_bits).
@group(0) @binding(0) var<storage, read> key_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> val_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> tensor: array<u32>;
struct P { kvh: u32, hd: u32, bs: u32, wpt: u32, rows: u32, gx: u32 }
var<immediate> p: P;
const PER_TENSOR: bool = {{PER_TENSOR}};
const FMAX: f32 = {{FMAX}};
const NV: u32 = {{NV}}u;
// PAD: the L lanes take NV vec4s each that cover more than the row (a row of vec4s no power of two <= L divides
// into few enough): a lane's vec4s past the row are neither loaded (zero: the amax is unchanged) nor written
const PAD: bool = {{PAD}};

fn enc(bits: u32) -> u32 { return f32_to_fp8(bits, {{MBITS}}u, {{BIAS}}, {{MAX_BITS}}u, {{MAX_CODE}}u); }

// Whether every magnitude within NEAR ulp of the float bits m encodes to the same FP8 code: the encoder
// rounds away `sh` low bits of the significand (sh = 23 - MBITS for an FP8 normal, more for a subnormal), so
// its result changes only where those bits pass the midpoint 2^(sh-1); a binade edge is at least half a step
// (>= 2^19 ulp) from any midpoint, saturation (beyond max) and flushing (far below the smallest subnormal)
// are flat.
fn fp8_sure(m: u32) -> bool {
  if (m > {{MAX_BITS}}u) { return true; }
  let e = i32(m >> 23u);
  if (e == 0) { return true; }
  let ue = e - 127;
  var sh = 23u - {{MBITS}}u;
  if (ue < 1 - {{BIAS}}) {
    let s = 24 - {{BIAS}} - i32({{MBITS}}u) - ue;
    if (s >= 26) { return true; }
    sh = u32(s);
  }
  let rem = ((m & 0x7FFFFFu) | 0x800000u) & ((1u << sh) - 1u);
  let half = 1u << (sh - 1u);
  return max(rem, half) - min(rem, half) > NEAR;
}

// The exact path: 4 FP8 codes (element l in byte l) of x / scale, inv ~ 1 / scale, each from one encode of
// q = x * inv where fp8_sure, else (or for a subnormal x, which a GPU may flush) from div_rn_bits. Only the
// words that fast_codes leaves unsure come here (a loop, not unrolled: one copy of the division).
fn codes(x: vec4<f32>, scale: f32, inv: f32) -> u32 {
  let m = bitcast<vec4<u32>>(x * inv) & vec4<u32>(ABS_MASK);
  let sign = (bitcast<vec4<u32>>(x) >> vec4<u32>(24u)) & vec4<u32>(0x80u);
  let sub = any_subnormal(x);
  var word = 0u;
  for (var l = 0u; l < 4u; l = l + 1u) {
    var c = enc(m[l]);
    if (sub || !fp8_sure(m[l])) { c = enc(div_rn_bits(x[l], scale) & ABS_MASK); }
    word = word | ((sign[l] | c) << (8u * l));
  }
  return word;
}

// The fast path, branch-free on the vec4 (a few integer ops an element, one encode). With m = |q| bits,
// q = |x| * inv, and m at least the smallest FP8 normal (MIN8): the code is m's rebiased bits (m - OFF)
// rounded at SH bits; rem = the SH low bits of m. t = m - OFF + HALF rounds half up: the same as round
// half to even except at rem == HALF, an exact midpoint, which the NEAR test sends to the exact path.
// rem within NEAR of HALF <=> ((t + NEAR) mod 2^SH) <= 2 NEAR: then q may be on the other side of a
// midpoint from x / scale (fp8_sure's test with sh = SH). Beyond max the rounded code is >= MAX_CODE
// (monotone): min() saturates it as f32_to_fp8 does. Returned: (word, 1 when every element is sure, else 0).
// An element is unsure (its word goes to `codes`) when near a midpoint, when m < MIN8 (FP8 subnormals,
// zeros, a flushed q) or when x has a zero exponent field (a subnormal x a GPU may flush; zeros).
const SH: u32 = 23u - {{MBITS}}u;
const HALF: u32 = 1u << (SH - 1u);
const MASK: u32 = (1u << SH) - 1u;
const OFF: u32 = u32(127 - {{BIAS}}) << 23u;     // float32 bits of 2^-BIAS: m - OFF rebiases the exponent
const MIN8: u32 = u32(128 - {{BIAS}}) << 23u;    // float32 bits of the smallest FP8 normal, 2^(1 - BIAS)
fn fast_codes(x: vec4<f32>, inv: f32) -> vec2<u32> {
  let u = bitcast<vec4<u32>>(x);
  let m = bitcast<vec4<u32>>(abs(x) * inv);
  let t = m - vec4<u32>(OFF - HALF);
  let c = min(t >> vec4<u32>(SH), vec4<u32>({{MAX_CODE}}u));
  let near = ((t + vec4<u32>(NEAR)) & vec4<u32>(MASK)) <= vec4<u32>(2u * NEAR);
  let low = m < vec4<u32>(MIN8);
  let flat = (u << vec4<u32>(1u)) < vec4<u32>(F32_MIN_NORMAL_BITS << 1u);
  let word = pack4xU8(c | ((u >> vec4<u32>(24u)) & vec4<u32>(0x80u)));
  return vec2<u32>(word, select(1u, 0u, any(near | low | flat)));
}

// max(amax / FMAX correctly rounded, 2^-126) (div_rn_bits' bits). FMAX = 1.75 * 2^k for both formats: the
// 25 quotient bits of the significands are (ma << 3) / 7, one integer division by a constant instead of
// div_rn_bits' 25-step loop (the generic division stays for another FMAX and for inf / NaN / sign bits).
const FMAX_SIG: u32 = ({{MAX_BITS}}u & 0x7FFFFFu) | 0x800000u;
const FMAX_EXP: i32 = i32({{MAX_BITS}}u >> 23u) - 127;
fn scale_bits(amax_bits: u32) -> u32 {
  let ea = i32(amax_bits >> 23u);
  if (FMAX_SIG != 0xE00000u || ea >= 255) {
    return max(div_rn_bits(bitcast<f32>(amax_bits), FMAX), F32_MIN_NORMAL_BITS);
  }
  if (ea == 0) { return F32_MIN_NORMAL_BITS; }     // 0 or a subnormal amax: a quotient below 2^-126
  var ma = (amax_bits & 0x7FFFFFu) | 0x800000u;
  var e = ea - 127 - FMAX_EXP;
  if (ma < FMAX_SIG) { ma = ma << 1u; e = e - 1; }
  if (e < -126) { return F32_MIN_NORMAL_BITS; }    // quotient below 2^-126: rounds to at most 2^-126
  let n = ma << 3u;                                // ma * 2^24 / (7 * 2^21)
  let q = n / 7u;                                  // in [2^24, 2^25): 24 significand bits + a round bit
  let sticky = n != q * 7u;
  var sig = q >> 1u;
  if ((q & 1u) == 1u && (sticky || (sig & 1u) == 1u)) { sig = sig + 1u; }
  var be = e + 127;
  if (sig == 0x1000000u) { sig = sig >> 1u; be = be + 1; }
  return (u32(be) << 23u) | (sig & 0x7FFFFFu);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let row = (wg.y * p.gx + wg.x) * R + lid / L;
  let lane = lid % L;
  let live = row < p.rows;
  let nv4 = p.hd / 4u;
  let src = row * nv4 + lane;
  let nvl = select(NV, (max(nv4, lane) - lane + L - 1u) / L, PAD);  // the lane's vec4s in the row
  var xk: array<vec4<f32>, NV>;
  var xv: array<vec4<f32>, NV>;
  var m = vec2<u32>(0xFFFFFFFFu);
  // @unroll
  for (var j = 0u; j < NV; j = j + 1u) {
    if (live && j < nvl) {
      xk[j] = key_in[src + j * L];
      xv[j] = val_in[src + j * L];
    }
    m = min(m, vec2<u32>(amax_key4(xk[j]), amax_key4(xv[j])));
  }
  if (!PER_TENSOR) { m = red_min2(m, lid, L); }
  if (!live) { return; }
  var ak = ~m.x;
  var av = ~m.y;
  if (PER_TENSOR) {
    ak = tensor[0];
    av = tensor[1];
  }
  let sk = bitcast<f32>(scale_bits(ak));
  let sv = bitcast<f32>(scale_bits(av));
  if (PER_TENSOR && row == 0u && lane == 0u) {
    tensor[2] = bitcast<u32>(sk);
    tensor[3] = bitcast<u32>(sv);
  }
  let t = row / p.kvh;
  let h = row % p.kvh;
  let slot = slots[t];
  if (slot == PAD_SLOT) { return; }
  let ik = approx_inv(sk);
  let iv = approx_inv(sv);
  let dst = ((slot / p.bs) * p.kvh + h) * p.bs * p.wpt + (slot % p.bs) * p.wpt;
  var sure = 1u;
  // @unroll
  for (var j = 0u; j < NV; j = j + 1u) {
    let wk = fast_codes(xk[j], ik);
    let wv = fast_codes(xv[j], iv);
    if (j < nvl) {
      k_cache[dst + lane + j * L] = wk.x;
      v_cache[dst + lane + j * L] = wv.x;
      sure = sure & wk.y & wv.y;
    }
  }
  // rare (a value within 16 ulp of an FP8 midpoint, an FP8 subnormal, a zero): the lane's unsure words again
  if (sure == 0u) { redo_unsure(src, dst + lane, nvl, sk, ik, sv, iv); }
  if (!PER_TENSOR && lane == 0u) {
    k_cache[dst + nv4] = bitcast<u32>(sk);
    v_cache[dst + nv4] = bitcast<u32>(sv);
  }
}
