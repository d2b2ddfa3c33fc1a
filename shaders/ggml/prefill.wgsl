// #include "ggml/common.wgsl"
// Causal (chunked) prefill attention over a llama.cpp block-type cache (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4)
// read in place: the values by the dequantiser's own element functions (ggml/value.wgsl, 4 of a block a call), the kernel
// attention/prefill_kernel.wgsl. kvviz/attention/prefill.py plans it; type {{TYPE}}.
const TYPE: u32 = {{TYPE}}u;
const BPB: u32 = {{BPB}}u;
const HDR: u32 = {{HDR}}u;
const QH: u32 = {{QH}}u;
const WPT: u32 = {{WPT}}u;   // u32 words of one token's row (its blocks, padded to whole words)

fn load_w(which: u32, i: u32) -> u32 { if (which == 0u) { return kc[i]; } return vc[i]; }
// #include "ggml/value.wgsl"

fn load4(which: u32, t: TokenAt, c: u32) -> vec4<f32> {
  return ggml_value4(which, ((t.phys * p.num_kv_heads + t.h) * BSZ + t.off) * WPT, 4u * c);
}
fn load_k4(t: TokenAt, c: u32) -> vec4<f32> { return load4(0u, t, c); }
fn load_v4(t: TokenAt, c: u32) -> vec4<f32> { return load4(1u, t, c); }

// #include "attention/prefill_kernel.wgsl"
