// #include "quant/common.wgsl"
// #include "fast/write_common.wgsl"
// Fast FP8 writer ({{NAME}}: {{MBITS}} mantissa bits, bias {{BIAS}}, max {{FMAX}}), the codes and scales of
// quant/fp8_write.wgsl (saturating RNE of x / scale, scale floored at 2^-126). PER_TENSOR = {{PER_TENSOR}}:
//   false: scale = max(amax_token / FMAX, 2^-126) per (token, KV head), record [hd/4 code words | scale];
//   true : scale = max(amax_tensor / FMAX, 2^-126), amax_tensor in tensor[0|1] (K|V) from
//          fast/write_fp8_amax.wgsl; the first row stores the scale bits in tensor[2|3]; record = codes.
// One lane group of L lanes per (token, KV head) row, K and V together (see write_common.wgsl).
@group(0) @binding(0) var<storage, read> key_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> val_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> tensor: array<u32>;
struct P { kvh: u32, hd: u32, bs: u32, wpt: u32, rows: u32, gx: u32 }
var<immediate> p: P;
const PER_TENSOR: bool = {{PER_TENSOR}};
const FMAX: f32 = {{FMAX}};
const NV: u32 = {{NV}}u;

fn enc(bits: u32) -> u32 { return f32_to_fp8(bits, {{MBITS}}u, {{BIAS}}, {{MAX_BITS}}u, {{MAX_CODE}}u); }

// Whether every magnitude within NEAR ulp of the float bits m encodes to the same FP8 code: the encoder
// rounds away `sh` low bits of the significand (sh = 23 - MBITS for an FP8 normal, more for a subnormal), so
// its result changes only where those bits pass the midpoint 2^(sh-1); a binade edge is at least half a step
// (>= 2^19 ulp) from any midpoint, saturation (beyond max) and flushing (far below the smallest subnormal)
// are flat.
fn fp8_sure(m: u32) -> bool {
  if (m > {{MAX_BITS}}u) { return true; }
  let e = i32(m >> 23u);
  if (e == 0) { return true; }
  let ue = e - 127;
  var sh = 23u - {{MBITS}}u;
  if (ue < 1 - {{BIAS}}) {
    let s = 24 - {{BIAS}} - i32({{MBITS}}u) - ue;
    if (s >= 26) { return true; }
    sh = u32(s);
  }
  let rem = ((m & 0x7FFFFFu) | 0x800000u) & ((1u << sh) - 1u);
  let half = 1u << (sh - 1u);
  return max(rem, half) - min(rem, half) > NEAR;
}

// 4 FP8 codes (element l in byte l) of x / scale, inv ~ 1 / scale.
fn codes(x: vec4<f32>, scale: f32, inv: f32) -> u32 {
  let m = bitcast<vec4<u32>>(x * inv) & vec4<u32>(ABS_MASK);
  let sign = (bitcast<vec4<u32>>(x) >> vec4<u32>(24u)) & vec4<u32>(0x80u);
  let sub = any_subnormal(x);
  var word = 0u;
  // @unroll
  for (var l = 0u; l < 4u; l = l + 1u) {
    var c = enc(m[l]);
    if (sub || !fp8_sure(m[l])) { c = enc(div_rn_bits(x[l], scale) & ABS_MASK); }
    word = word | ((sign[l] | c) << (8u * l));
  }
  return word;
}

fn scale_bits(amax_bits: u32) -> u32 { return max(div_rn_bits(bitcast<f32>(amax_bits), FMAX), F32_MIN_NORMAL_BITS); }

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let row = (wg.y * p.gx + wg.x) * R + lid / L;
  let lane = lid % L;
  let live = row < p.rows;
  let nv4 = p.hd / 4u;
  let src = row * nv4 + lane;
  var xk: array<vec4<f32>, NV>;
  var xv: array<vec4<f32>, NV>;
  var m = vec2<u32>(0xFFFFFFFFu);
  // @unroll
  for (var j = 0u; j < NV; j = j + 1u) {
    if (live) {
      xk[j] = key_in[src + j * L];
      xv[j] = val_in[src + j * L];
    }
    m = min(m, vec2<u32>(amax_key4(xk[j]), amax_key4(xv[j])));
  }
  if (!PER_TENSOR) { m = red_min2(m, lid, L); }
  if (!live) { return; }
  var ak = ~m.x;
  var av = ~m.y;
  if (PER_TENSOR) {
    ak = tensor[0];
    av = tensor[1];
  }
  let sk = bitcast<f32>(scale_bits(ak));
  let sv = bitcast<f32>(scale_bits(av));
  if (PER_TENSOR && row == 0u && lane == 0u) {
    tensor[2] = bitcast<u32>(sk);
    tensor[3] = bitcast<u32>(sv);
  }
  let t = row / p.kvh;
  let h = row % p.kvh;
  let slot = slots[t];
  if (slot == PAD_SLOT) { return; }
  let ik = approx_inv(sk);
  let iv = approx_inv(sv);
  let dst = ((slot / p.bs) * p.kvh + h) * p.bs * p.wpt + (slot % p.bs) * p.wpt;
  // @unroll
  for (var j = 0u; j < NV; j = j + 1u) {
    k_cache[dst + lane + j * L] = codes(xk[j], sk, ik);
    v_cache[dst + lane + j * L] = codes(xv[j], sv, iv);
  }
  if (!PER_TENSOR && lane == 0u) {
    k_cache[dst + nv4] = bitcast<u32>(sk);
    v_cache[dst + nv4] = bitcast<u32>(sv);
  }
}
