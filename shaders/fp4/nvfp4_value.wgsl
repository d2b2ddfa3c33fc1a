// ---- shaders/fp4/nvfp4_value.wgsl: one element of an NVFP4 record (fp4/nvfp4_dequant.wgsl, fp4/prefill.wgsl) before the
// tensor scale: e2m1 * its 16-element block's E4M3 scale, exact in float32 (kvviz/families/fp4/oracle.py); the
// includer multiplies the tensor scale s_t (one float32 multiply). Record (nvfp4_write.wgsl): the D/16 E4M3 scale
// bytes padded to whole words, then the codes, two a byte. The includer defines load_w(which, word) (K: which 0,
// V: 1) and includes ggml/common.wgsl (e2m1_doubled; fp8_to_f32 from common/quant.wgsl).

// byte `b` of the record starting at word `rec`
fn rbyte(which: u32, rec: u32, b: u32) -> u32 { return (load_w(which, rec + b / 4u) >> (8u * (b % 4u))) & 0xFFu; }

// the E4M3 scale of 16-element block s of the record starting at word `rec`
fn nvfp4_scale(which: u32, rec: u32, s: u32) -> f32 { return fp8_to_f32(rbyte(which, rec, s), 3u, 7); }

// element d of the record starting at word `rec`, head size hd, its block's scale sc, before the tensor scale
fn nvfp4_scaled(which: u32, rec: u32, d: u32, hd: u32, sc: f32) -> f32 {
  let sw = (hd / 16u + 3u) / 4u;
  let j = d % 16u;
  let c = (rbyte(which, rec, 4u * sw + 8u * (d / 16u) + (j % 8u)) >> (4u * (j / 8u))) & 0xFu;
  return e2m1_doubled(c) * 0.5 * sc;
}

// element d of the record starting at word `rec`, head size hd, before the tensor scale
fn nvfp4_block_value(which: u32, rec: u32, d: u32, hd: u32) -> f32 {
  return nvfp4_scaled(which, rec, d, hd, nvfp4_scale(which, rec, d / 16u));
}

// ---- end of fp4/nvfp4_value.wgsl
