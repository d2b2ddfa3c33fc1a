// The fast KIVI decode's int8 query (qk "i8": kivi/decode_fast.wgsl.j2), made once per key group and query head from
// the group-scaled query qk = q * s (q pre-scaled by scale*log2 e). Its numpy twin is
// kvviz/families/kivi/oracle.py requantize_query; the two give the same codes bit for bit, because the step is a
// power of two built from m's exponent bits: qk * 2^(7-k) is exact in f32, and round() is round-half-to-even like
// numpy's rint.
//   m = max |qk_c| over the head = f * 2^k, f in [0.5, 1): the step is 2^(k-7), the codes
//   clamp(round(qk_c * 2^(7-k)), -127, 127) (|qk_c| * 2^(7-k) < 128, so only a value rounding to +-128 clamps).
// m below 2^-119 (its exponent field e < 8: tiny, subnormal or zero) gives all-zero codes and step 0: a GPU may flush
// a subnormal qk_c to zero, and from e = 8 up every subnormal qk_c rounds to code 0 anyway (|qk_c| * 2^(7-k) < 2^-1),
// so the codes do not depend on whether it does; 2^(7-k) would also leave the f32 range below e = 6. An infinite or
// NaN m (the f32 product q * s overflowed; the exact kernel's logits are not finite there either) gives the step NaN,
// so every logit of the group is NaN and the output is refused as non-finite instead of silently wrong.

// (2^(7-k), 2^(k-7)) for m = max |qk_c| >= 0, built from m's exponent field e (k = e - 126) by bit operations
fn qi8_scales(m: f32) -> vec2<f32> {
  let e = (bitcast<u32>(m) >> 23u) & 0xFFu;
  let ok = e >= 8u && e < 255u;
  let factor = select(0.0, bitcast<f32>((260u - e) << 23u), ok);
  let step = select(select(0.0, bitcast<f32>(0x7FC00000u), e == 255u), bitcast<f32>((e - 6u) << 23u), ok);
  return vec2<f32>(factor, step);
}

// the codes of 4 channels of qk at the factor 2^(7-k)
fn qi8_codes(x: vec4<f32>, factor: f32) -> vec4<i32> {
  return vec4<i32>(clamp(round(x * factor), vec4<f32>(-127.0), vec4<f32>(127.0)));
}

// the largest of |x|'s 4 components
fn qi8_amax(x: vec4<f32>) -> f32 {
  let a = abs(x);
  return max(max(a.x, a.y), max(a.z, a.w));
}
