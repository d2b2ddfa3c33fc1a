// #include "ggml/common.wgsl"
// Causal (chunked) prefill attention over an NVFP4 cache read in place: each value by the dequantiser's own element
// function (fp4/nvfp4_value.wgsl) times the tensor scale, as fp4/nvfp4_dequant.wgsl computes it; the kernel
// attention/prefill_kernel.wgsl. kvviz/attention/prefill.py plans it.
@group(0) @binding(6) var<storage, read> tensor: array<u32>;  // [amax K, amax V, s_t K, s_t V] (f32 bits)

const WPT: u32 = {{WPT}}u;   // u32 words of one token's record

fn load_w(which: u32, i: u32) -> u32 { if (which == 0u) { return kc[i]; } return vc[i]; }
// #include "fp4/nvfp4_value.wgsl"

// dims 4c..4c+3 (one 16-element block: its scale decoded once) times the tensor scale
fn load4(which: u32, t: TokenAt, c: u32) -> vec4<f32> {
  let rec = ((t.phys * p.num_kv_heads + t.h) * BSZ + t.off) * WPT;
  let st = bitcast<f32>(tensor[2u + which]);
  let d = 4u * c;
  let sc = nvfp4_scale(which, rec, d / 16u);
  return vec4<f32>(nvfp4_scaled(which, rec, d, D, sc) * st, nvfp4_scaled(which, rec, d + 1u, D, sc) * st,
                   nvfp4_scaled(which, rec, d + 2u, D, sc) * st, nvfp4_scaled(which, rec, d + 3u, D, sc) * st);
}
fn load_k4(t: TokenAt, c: u32) -> vec4<f32> { return load4(0u, t, c); }
fn load_v4(t: TokenAt, c: u32) -> vec4<f32> { return load4(1u, t, c); }

// #include "attention/prefill_kernel.wgsl"
