// #include "common/quant.wgsl"
// ---- shaders/ggml/common.wgsl: what the ggml block-type and FP4 kernels share -----------------------
// f16 <-> f32 with integer arithmetic (round to nearest even, subnormals kept, no flush to zero), the
// E2M1 / E8M0 tables of MXFP4 and the iq4_nl values (kvviz/families/ggml/format.py).

// float32 -> IEEE half bits, round to nearest even; finite input; |x| >= 65520 gives +-inf (0x7C00).
fn f32_to_f16_bits(f: f32) -> u32 {
  let u = bitcast<u32>(f);
  let sign = (u >> 16u) & 0x8000u;
  let a = u & ABS_MASK;
  let e = i32(a >> 23u) - 127;
  if (e > 15) { return sign | 0x7C00u; }
  if (e >= -14) {                       // a normal half: rebias, round the 13 dropped mantissa bits
    var h = (u32(e + 15) << 10u) | ((a & 0x7FFFFFu) >> 13u);
    let rem = a & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) == 1u)) { h = h + 1u; }   // a carry may reach inf: right
    return sign | h;
  }
  if (e < -25) { return sign; }          // below half the smallest half subnormal (f32 subnormals too)
  let sig = (a & 0x7FFFFFu) | 0x800000u;  // value = sig * 2^(e - 23) = (sig >> s) units of 2^-24
  let s = u32(-e - 1);
  var h = sig >> s;
  let rb = (sig >> (s - 1u)) & 1u;
  let low = sig & ((1u << (s - 1u)) - 1u);
  if (rb == 1u && (low != 0u || (h & 1u) == 1u)) { h = h + 1u; }
  return sign | h;
}

// IEEE half bits -> float32, exactly (half subnormals become float32 normals).
fn f16_to_f32(h: u32) -> f32 {
  let sign = (h & 0x8000u) << 16u;
  let e = (h >> 10u) & 0x1Fu;
  let m = h & 0x3FFu;
  if (e == 0u) { return bitcast<f32>(sign | bitcast<u32>(ldexp(f32(m), -24))); }
  if (e == 31u) { return bitcast<f32>(sign | 0x7F800000u | (m << 13u)); }
  return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

// ggml_e8m0_to_fp32_half: 2^(e - 128) as float32 bits (subnormal for e < 2).
fn e8m0_half_bits(e: u32) -> u32 { return select((e - 1u) << 23u, 0x00200000u << e, e < 2u); }

// E2M1 values doubled, indexed by the 4-bit code (sign in bit 3): gguf's kvalues of MXFP4 / NVFP4 (int8, so
// code 8, E2M1 -0, decodes to +0).
var<private> E2M1_DOUBLED: array<f32, 16> = array<f32, 16>(0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0,
                                                            0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0);
fn e2m1_doubled(c: u32) -> f32 { return E2M1_DOUBLED[c & 15u]; }

// kvalues_iq4nl
var<private> IQ4NL_VALUES: array<f32, 16> = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
                                                            1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);
fn iq4nl_value(c: u32) -> f32 { return IQ4NL_VALUES[c & 15u]; }
// ---- end of ggml/common.wgsl ----------------------------------------------------------------------
