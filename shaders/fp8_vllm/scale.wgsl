// #include "common/quant.wgsl"
// vLLM-style FP8 calibration, step 2 (after fp8_vllm_amax.wgsl in the same pass):
//   scales[i] = max(amax[i] / fmax, 2^-126) as float32 bits, for i < n (n = 2 * kv_heads: K heads, then V),
// with the correctly rounded division of common.wgsl (bit-identical to numpy's float32 amax / fmax).
// One workgroup of 64 threads.
@group(0) @binding(0) var<storage, read_write> amax: array<atomic<u32>>;
@group(0) @binding(1) var<storage, read_write> scales: array<u32>;
struct P { n: u32, fmax: f32 }
var<immediate> p: P;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>) {
  for (var i = lid.x; i < p.n; i = i + 64u) {
    var s = div_rn_bits(bitcast<f32>(atomicLoad(&amax[i])), p.fmax);
    if (s < F32_MIN_NORMAL_BITS) { s = F32_MIN_NORMAL_BITS; }   // floor 2^-126 (amax >= 0)
    scales[i] = s;
  }
}
