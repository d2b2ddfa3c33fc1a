// #include "common/quant.wgsl"
// vLLM-style FP8 cache writer: codes only (record wpt = hd/4 words, element 4w+l in byte l), the scale
// from the side buffer scales[which * kvh + g] (g = h per head, 0 per tensor), calibrated once
// (fp8_vllm_amax + fp8_vllm_scale) or given by the host, and NOT recomputed from the token: values
// beyond the calibrated range saturate to +-max. code = f32_to_fp8(x / scale) (correctly rounded
// division, saturating round to nearest even; common.wgsl). Every element whose |x / scale| has no
// finite FP8 code (float bits above sat_bits: > 464 for E4M3FN, >= 61440 for E5M2) is counted in
// sat[which * kvh + h] (atomicAdd, never reset by the writer).
// The format travels in the immediates (mbits, bias, max_bits, max_code, sat_bits): no defines.
// Grid (rows, kv_heads, 2 = K|V), 64 threads; padding rows (PAD_SLOT) are skipped.
@group(0) @binding(0) var<storage, read> key_in: array<f32>;
@group(0) @binding(1) var<storage, read> val_in: array<f32>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<u32>;
@group(0) @binding(5) var<storage, read> scales: array<u32>;
@group(0) @binding(6) var<storage, read_write> sat: array<atomic<u32>>;
struct P { kvh: u32, hd: u32, bs: u32, wpt: u32, mbits: u32, bias: u32, max_bits: u32, max_code: u32, sat_bits: u32, per_head: u32 }
var<immediate> p: P;

fn load_x(which: u32, i: u32) -> f32 { if (which == 0u) { return key_in[i]; } return val_in[i]; }
fn store_w(which: u32, i: u32, w: u32) { if (which == 0u) { k_cache[i] = w; } else { v_cache[i] = w; } }

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let t = wg.x;
  let h = wg.y;
  let which = wg.z;
  let slot = slots[t];
  if (slot == PAD_SLOT) { return; }     // uniform over the workgroup; no barrier follows
  let g = select(0u, h, p.per_head != 0u);
  let scale = bitcast<f32>(scales[which * p.kvh + g]);
  let src = (t * p.kvh + h) * p.hd;
  let dst = ((slot / p.bs) * p.kvh + h) * p.bs * p.wpt + (slot % p.bs) * p.wpt;
  var n_sat = 0u;
  for (var w = lid.x; w < p.hd / 4u; w = w + 64u) {
    var word = 0u;
    for (var l = 0u; l < 4u; l = l + 1u) {
      let v = div_rn_bits(load_x(which, src + 4u * w + l), scale);
      if ((v & ABS_MASK) > p.sat_bits) { n_sat = n_sat + 1u; }
      word = word | (f32_to_fp8(v, p.mbits, i32(p.bias), p.max_bits, p.max_code) << (8u * l));
    }
    store_w(which, dst + w, word);
  }
  if (n_sat > 0u) { atomicAdd(&sat[which * p.kvh + h], n_sat); }
}
