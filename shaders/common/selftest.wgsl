// #include "common/quant.wgsl"
// Self-test kernels of the common helpers (tests/test_quant_methods.py): element-wise
// out[i] = div_rn_bits(a[i], b[i]), or FP8 encode/decode of a[i] for the format in the defines.
@group(0) @binding(0) var<storage, read> a_in: array<f32>;
@group(0) @binding(1) var<storage, read> b_in: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
struct P { n: u32, row: u32 }
var<immediate> p: P;

@compute @workgroup_size(64)
fn div_test(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x + gid.y * p.row;
  if (i >= p.n) { return; }
  out[i] = div_rn_bits(a_in[i], b_in[i]);
}

@compute @workgroup_size(64)
fn fp8_test(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x + gid.y * p.row;
  if (i >= p.n) { return; }
  let c = f32_to_fp8(bitcast<u32>(a_in[i]), {{MBITS}}u, {{BIAS}}, {{MAX_BITS}}u, {{MAX_CODE}}u);
  // low byte: the code; the f32 decode of the code goes to the second half of `out`
  out[i] = c;
  out[p.n + i] = bitcast<u32>(fp8_to_f32(c, {{MBITS}}u, {{BIAS}}));
}
