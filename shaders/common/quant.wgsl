// ---- shaders/common/quant.wgsl: helpers every quant/*.wgsl kernel includes -----------------------
// (first line of each kernel: `// #include "common/quant.wgsl"`, resolved by kvviz/gpu/shaders.py.)
//
// Exactness: every quantiser divides through `div_rn_bits`, a correctly rounded (round to nearest,
// ties to even) float32 division done with integer arithmetic. Vulkan only promises 2.5 ulp for a
// float division, and drivers may replace x / y by x * (1 / y); with the integer division the codes
// and scales written on any GPU are bit-identical to numpy's IEEE float32 `x / y`.
// Maxima and minima are taken on integer keys of the float bits (a total order: -0 < +0), so they
// are independent of denormal flushing and of how a driver orders signed zeros.

const PAD_SLOT: u32 = 0xFFFFFFFFu;
const SIGN_BIT: u32 = 0x80000000u;
const ABS_MASK: u32 = 0x7FFFFFFFu;
const F32_MIN_NORMAL_BITS: u32 = 0x00800000u; // 2^-126
const MIN_RANGE_BITS: u32 = 0x0D800000u;      // 2^-100: smaller max-min ranges are degenerate

// The significands of a / b for the divisions below: 24-bit ma, mb with bit 23 set (subnormals normalised),
// ma shifted so that ma >= mb, and e the quotient's unbiased exponent. a, b finite and nonzero.
struct DivSig { ma: u32, mb: u32, e: i32 }
fn div_sig(ua: u32, ub: u32) -> DivSig {
  var ea = i32((ua >> 23u) & 0xFFu);
  var ma = ua & 0x7FFFFFu;
  var eb = i32((ub >> 23u) & 0xFFu);
  var mb = ub & 0x7FFFFFu;
  // 24-bit significands with bit 23 set; value = sig * 2^(e - 127 - 23)
  if (ea == 0) { let s = countLeadingZeros(ma) - 8u; ma = ma << s; ea = 1 - i32(s); } else { ma = ma | 0x800000u; }
  if (eb == 0) { let s = countLeadingZeros(mb) - 8u; mb = mb << s; eb = 1 - i32(s); } else { mb = mb | 0x800000u; }
  var e = ea - eb;                      // unbiased exponent of the quotient
  if (ma < mb) { ma = ma << 1u; e = e - 1; }
  return DivSig(ma, mb, e);
}

// The float32 bits of the quotient (q + frac) * 2^(e - 24), q = floor(ma 2^24 / mb) in [2^24, 2^25), sticky =
// frac != 0, rounded to nearest even (subnormal results exact, overflow to +-inf).
fn div_round(sign: u32, q: u32, sticky: bool, e: i32) -> u32 {
  if (e >= -126) {
    var sig = q >> 1u;
    if ((q & 1u) == 1u && (sticky || (sig & 1u) == 1u)) { sig = sig + 1u; }
    var be = e + 127;
    if (sig == 0x1000000u) { sig = sig >> 1u; be = be + 1; }
    if (be >= 255) { return sign | 0x7F800000u; }
    return sign | (u32(be) << 23u) | (sig & 0x7FFFFFu);
  }
  // subnormal result, in units of 2^-149: q * 2^(e + 125), shift >= 2
  let sh = u32(-(e + 125));
  if (sh > 25u) { return sign; }
  var v = q >> sh;
  let rb = (q >> (sh - 1u)) & 1u;
  let low = q & ((1u << (sh - 1u)) - 1u);
  if (rb == 1u && (sticky || low != 0u || (v & 1u) == 1u)) { v = v + 1u; }
  return sign | v;                      // v == 2^23 is the smallest normal: the encoding carries over
}

// Correctly rounded a / b as float32 bits. a, b finite; b != 0 (a zero b gives +-inf).
// Subnormal operands and subnormal results are handled exactly (no flush to zero).
fn div_rn_bits(a: f32, b: f32) -> u32 {
  let ua = bitcast<u32>(a);
  let ub = bitcast<u32>(b);
  let sign = (ua ^ ub) & SIGN_BIT;
  if ((ua & ABS_MASK) == 0u) { return sign; }                 // +-0 / b: signed zero
  if ((ub & ABS_MASK) == 0u) { return sign | 0x7F800000u; }   // never used by the quantisers
  let d = div_sig(ua, ub);
  // restoring long division: 25 quotient bits (24 significand bits + 1 round bit), then a sticky bit
  var q = 0u;
  var r = d.ma;
  for (var i = 0u; i < 25u; i = i + 1u) {
    q = q << 1u;
    if (r >= d.mb) { r = r - d.mb; q = q | 1u; }
    r = r << 1u;
  }
  return div_round(sign, q, r != 0u, d.e);
}

// div_rn_bits without the 25-step loop, the same bits for every input: q = floor(ma 2^24 / mb) starts from the
// float quotient of the exact significands (f32(ma) / f32(mb), both exact, within 2.5 ulp: a few units of q) and
// is corrected one unit at a time on the exact remainder ma 2^24 - q mb (while q is within 127 units of the
// answer |.| < 2^31, so its value mod 2^32 in u32 arithmetic is exact). ~25 operations, the loop ~150; the fast
// writers' divisions (tests/test_fast_write_ggml.py checks it against float32 a / b and div_rn).
fn div_fast_bits(a: f32, b: f32) -> u32 {
  let ua = bitcast<u32>(a);
  let ub = bitcast<u32>(b);
  let sign = (ua ^ ub) & SIGN_BIT;
  if ((ua & ABS_MASK) == 0u) { return sign; }
  if ((ub & ABS_MASK) == 0u) { return sign | 0x7F800000u; }
  let d = div_sig(ua, ub);
  var q = u32(f32(d.ma) / f32(d.mb) * 16777216.0);
  var r = bitcast<i32>((d.ma << 24u) - q * d.mb);
  loop { if (r >= 0) { break; } q = q - 1u; r = r + i32(d.mb); }
  loop { if (r < i32(d.mb)) { break; } q = q + 1u; r = r - i32(d.mb); }
  return div_round(sign, q, r != 0, d.e);
}
fn div_fast(a: f32, b: f32) -> f32 { return bitcast<f32>(div_fast_bits(a, b)); }

// NVFP4's per-tensor scales of K and V from their amax bits: s_t = max(amax / 2688 correctly rounded, 2^-126), as bits
// (fp4/nvfp4_scale_fast.wgsl; fp4/nvfp4_write_fast.wgsl where it derives them itself, SCALE_PASS = 0)
fn nvfp4_tensor_scale_bits(amax: vec2<u32>) -> vec2<u32> {
  let s = vec2<u32>(div_fast_bits(bitcast<f32>(amax.x), 2688.0), div_fast_bits(bitcast<f32>(amax.y), 2688.0));
  return max(s, vec2<u32>(F32_MIN_NORMAL_BITS));
}

fn div_rn(a: f32, b: f32) -> f32 { return bitcast<f32>(div_rn_bits(a, b)); }

// Total-order key of float bits: unsigned comparison of keys = numeric order, with -0 < +0.
fn order_key(u: u32) -> u32 { return select(u | SIGN_BIT, ~u, (u & SIGN_BIT) != 0u); }
fn key_bits(k: u32) -> u32 { return select(~k, k & ABS_MASK, (k & SIGN_BIT) != 0u); }

// Asymmetric quantiser with `levels` = 2^bits - 1 steps: scale = (max - min) / levels (degenerate,
// i.e. 0, when max - min < 2^-100 or is 0), code = clamp(round((x - min) / scale), 0, levels).
fn asym_scale(mn: f32, mx: f32, levels: u32) -> f32 {
  let range = mx - mn;
  if (!(range >= bitcast<f32>(MIN_RANGE_BITS))) { return 0.0; }
  return div_rn(range, f32(levels));
}

fn asym_code(x: f32, mn: f32, scale: f32, levels: u32) -> u32 {
  if (scale == 0.0) { return 0u; }
  let q = round(div_rn(x - mn, scale));   // WGSL round: half to even, like numpy rint
  return u32(clamp(q, 0.0, f32(levels)));
}

// float32 bits -> FP8 code (sign in bit 7), round to nearest even, SATURATING: finite values beyond
// the largest finite FP8 value give +-max (E4M3FN has no inf; E5M2's inf is never produced).
// mbits: mantissa bits; bias: exponent bias; max_bits: float32 bits of the largest finite value;
// max_code: its code. Input must be finite.
fn f32_to_fp8(bits: u32, mbits: u32, bias: i32, max_bits: u32, max_code: u32) -> u32 {
  let sign = (bits >> 24u) & 0x80u;
  let a = bits & ABS_MASK;
  if (a > max_bits) { return sign | max_code; }
  let e = i32(a >> 23u);
  if (e == 0) { return sign; }          // +-0 and f32 subnormals: far below half the smallest FP8 subnormal
  let ue = e - 127;
  let sig = (a & 0x7FFFFFu) | 0x800000u;
  if (ue >= 1 - bias) {                 // FP8 normal: rebias and round the mantissa
    let shift = 23u - mbits;
    var code = (u32(ue + bias) << mbits) | ((a & 0x7FFFFFu) >> shift);
    let rem = a & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (code & 1u) == 1u)) { code = code + 1u; }
    return sign | code;                 // a mantissa carry moves into the exponent field correctly
  }
  // FP8 subnormal: value / 2^(1 - bias - mbits) = sig >> s
  let s = u32(24 - bias - i32(mbits) - ue);
  if (s >= 25u) { return sign; }         // below half the smallest subnormal
  var code = sig >> s;
  let rb = (sig >> (s - 1u)) & 1u;
  let low = sig & ((1u << (s - 1u)) - 1u);
  if (rb == 1u && (low != 0u || (code & 1u) == 1u)) { code = code + 1u; }
  return sign | code;                   // code == 2^mbits is the smallest normal
}

fn fp8_to_f32(code: u32, mbits: u32, bias: i32) -> f32 {
  let sign = (code & 0x80u) << 24u;
  let ef = (code >> mbits) & ((1u << (7u - mbits)) - 1u);
  let m = code & ((1u << mbits) - 1u);
  var mag: u32;
  if (ef == 0u) {
    mag = bitcast<u32>(ldexp(f32(m), 1 - bias - i32(mbits)));   // exact: a small integer times 2^k
  } else {
    mag = (u32(i32(ef) - bias + 127) << 23u) | (m << (23u - mbits));
  }
  return bitcast<f32>(sign | mag);
}
// ---- end of common.wgsl ---------------------------------------------------------------------------
