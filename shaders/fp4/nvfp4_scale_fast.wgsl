// #include "common/quant.wgsl"
// NVFP4's per-tensor scales, once (kvviz/families/ggml/writer.py NVFP4_SCALE_PASS): from the amax pass's
// tensor[0|1] (max |x| bits of K | V, fp8/amax_fast.wgsl), s_t = max(amax / 2688 correctly rounded, 2^-126)
// into tensor[2|3], which the writer (fp4/nvfp4_write_fast.wgsl, SCALE_PASS = 1) then reads instead of each of its
// threads dividing twice. One invocation: the same nvfp4_tensor_scale_bits, the same bits.
@group(0) @binding(0) var<storage, read_write> tensor: array<u32>;

@compute @workgroup_size(1)
fn main() {
  let s = nvfp4_tensor_scale_bits(vec2<u32>(tensor[0], tensor[1]));
  tensor[2] = s.x;
  tensor[3] = s.y;
}
