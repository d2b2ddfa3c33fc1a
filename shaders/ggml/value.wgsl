// ---- shaders/ggml/value.wgsl: one element of a llama.cpp block-type record (ggml/dequant.wgsl, ggml/prefill.wgsl),
// as gguf.quants.dequantize computes it: every product d*q is exact in float32 (f16 d: 11 significant bits, q: at
// most 8), so the values are bit-identical to gguf's (a fused d*q + m is identical too). The includer defines
// TYPE, BPB, HDR, QH (kvviz.families.ggml.format.GgmlType.defines), load_w(which, word) (K: which 0, V: 1) and
// includes ggml/common.wgsl.

// byte `b` of the record starting at word `rec`
fn rbyte(which: u32, rec: u32, b: u32) -> u32 { return (load_w(which, rec + b / 4u) >> (8u * (b % 4u))) & 0xFFu; }
fn rhalf(which: u32, rec: u32, b: u32) -> u32 { return rbyte(which, rec, b) | (rbyte(which, rec, b + 1u) << 8u); }

// the scale of the block whose first byte is b0 (its f16 d; mxfp4: 2^(e - 128), the doubled values' scale) and its
// min (q4_1 / q5_1's f16 m; 0 otherwise)
fn ggml_block(which: u32, rec: u32, b0: u32) -> vec2<f32> {
  if (TYPE == 6u) { return vec2<f32>(bitcast<f32>(e8m0_half_bits(rbyte(which, rec, b0))), 0.0); }
  if (TYPE == 2u || TYPE == 4u) { return vec2<f32>(f16_to_f32(rhalf(which, rec, b0)), f16_to_f32(rhalf(which, rec, b0 + 2u))); }
  return vec2<f32>(f16_to_f32(rhalf(which, rec, b0)), 0.0);
}

// the value of element j of the block whose first byte is b0, before its scale and min: q8_0's signed byte, q4_0's
// q - 8, q5_0's q - 16, iq4_nl's kvalue, mxfp4's doubled E2M1 value, q4_1 / q5_1's q
fn ggml_code(which: u32, rec: u32, b0: u32, j: u32) -> f32 {
  let qs = b0 + HDR + 4u * QH;
  if (TYPE == 0u) { return f32(i32(rbyte(which, rec, qs + j) << 24u) >> 24u); }
  var q = (rbyte(which, rec, qs + (j % 16u)) >> (4u * (j / 16u))) & 0xFu;
  if (QH == 1u) { q = q | (((rbyte(which, rec, b0 + HDR + j / 8u) >> (j % 8u)) & 1u) << 4u); }
  if (TYPE == 6u) { return e2m1_doubled(q); }
  if (TYPE == 1u) { return f32(i32(q) - 8); }
  if (TYPE == 3u) { return f32(i32(q) - 16); }
  if (TYPE == 5u) { return iq4nl_value(q); }
  return f32(q);
}

// scale * code (+ min): one float32 product (and sum)
fn ggml_scaled(s: vec2<f32>, code: f32) -> f32 {
  if (TYPE == 2u || TYPE == 4u) { return s.x * code + s.y; }
  return s.x * code;
}

// element d of the record starting at word `rec`
fn ggml_value(which: u32, rec: u32, d: u32) -> f32 {
  let b0 = (d / 32u) * BPB;   // first byte of the element's block
  return ggml_scaled(ggml_block(which, rec, b0), ggml_code(which, rec, b0, d % 32u));
}

// elements d..d+3 (d a multiple of 4: one block) of the record starting at word `rec`, the block's scale decoded once
fn ggml_value4(which: u32, rec: u32, d: u32) -> vec4<f32> {
  let b0 = (d / 32u) * BPB;
  let j = d % 32u;
  let s = ggml_block(which, rec, b0);
  return vec4<f32>(ggml_scaled(s, ggml_code(which, rec, b0, j)), ggml_scaled(s, ggml_code(which, rec, b0, j + 1u)),
                   ggml_scaled(s, ggml_code(which, rec, b0, j + 2u)), ggml_scaled(s, ggml_code(which, rec, b0, j + 3u)));
}
// ---- end of ggml/value.wgsl
