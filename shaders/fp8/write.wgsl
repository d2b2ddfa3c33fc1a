// #include "common/quant.wgsl"
// FP8 writer ({{NAME}}: {{MBITS}} mantissa bits, bias {{BIAS}}, max {{FMAX}}), OCP formats, saturating,
// round to nearest even; the encoder (common.wgsl f32_to_fp8) works on the float bits.
// PER_TENSOR = {{PER_TENSOR}}:
//   false: scale = max(amax_token / FMAX, 2^-126) per (token, kv head); record wpt = hd/4 + 1 words,
//          words 0..hd/4-1 codes (element 4w+l in byte l), word hd/4 = scale bits;
//   true : scale = max(amax_tensor / FMAX, 2^-126) with amax_tensor from fp8_amax.wgsl in tensor[0|1]
//          (K|V); the writer stores the scale bits in tensor[2|3]; record wpt = hd/4 words (codes only).
// code = f32_to_fp8(x / scale) with a correctly rounded division. Grid (rows, kv_heads, 2), 64 threads.
// #include "common/writer_io.wgsl"
@group(0) @binding(5) var<storage, read_write> tensor: array<u32>;
const PER_TENSOR: bool = {{PER_TENSOR}};
const FMAX: f32 = {{FMAX}};
var<workgroup> s_red: array<u32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let t = wg.x;
  let h = wg.y;
  let which = wg.z;
  let tid = lid.x;
  let src = (t * p.kvh + h) * p.hd;
  let nw = p.hd / 4u;
  var m = 0u;
  if (!PER_TENSOR) {
    for (var w = tid; w < nw; w = w + WG) {
      for (var l = 0u; l < 4u; l = l + 1u) { m = max(m, bitcast<u32>(load_x(which, src + 4u * w + l)) & ABS_MASK); }
    }
  }
  s_red[tid] = m;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (tid < s) { s_red[tid] = max(s_red[tid], s_red[tid + s]); }
    workgroupBarrier();
  }
  var amax_bits = s_red[0];
  if (PER_TENSOR) { amax_bits = tensor[which]; }
  var scale_bits = div_rn_bits(bitcast<f32>(amax_bits), FMAX);
  if (scale_bits < F32_MIN_NORMAL_BITS) { scale_bits = F32_MIN_NORMAL_BITS; }   // floor 2^-126 (scale >= 0)
  let scale = bitcast<f32>(scale_bits);
  if (PER_TENSOR && t == 0u && h == 0u && tid == 0u) { tensor[2u + which] = scale_bits; }
  let slot = slots[t];
  if (slot == PAD_SLOT) { return; }
  let dst = ((slot / p.bs) * p.kvh + h) * p.bs * p.wpt + (slot % p.bs) * p.wpt;
  for (var w = tid; w < nw; w = w + WG) {
    var word = 0u;
    for (var l = 0u; l < 4u; l = l + 1u) {
      let v = div_rn_bits(load_x(which, src + 4u * w + l), scale);
      word = word | (f32_to_fp8(v, {{MBITS}}u, {{BIAS}}, {{MAX_BITS}}u, {{MAX_CODE}}u) << (8u * l));
    }
    store_w(which, dst + w, word);
  }
  if (!PER_TENSOR && tid == 0u) { store_w(which, dst + nw, scale_bits); }
}
