// #include "common/quant.wgsl"
// Fast f16 writer (method f16): K and V rows [rows, kv_heads, hd] f32 -> the f16 paged cache u32
// [num_blocks, kv_heads, block_size, hd/2], element 2w in the low half of word w, 2w+1 in the high half.
// Conversion: IEEE round to nearest even with subnormals (numpy astype(float16)), done on the float bits
// (pack2x16float's rounding and denormal handling are left to the implementation). The host refuses
// values that round to infinity (|x| >= 65520) before dispatch, so none reaches this kernel.
// One invocation per (row, vec4 of the head): a row's hd/4 invocations read 16 B each of K and V and
// write 8 B each. Grid 2-D: workgroup (x, y) is number y * gx + x.
@group(0) @binding(0) var<storage, read> key_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> val_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read_write> k_cache: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<vec2<u32>>;
struct P { kvh: u32, hd: u32, bs: u32, items: u32, gx: u32 }
var<immediate> p: P;

// float32 bits -> float16 bits, round to nearest even; |x| < 65520 (finite result).
fn f16_bits(b: u32) -> u32 {
  let sign = (b >> 16u) & 0x8000u;
  let a = b & ABS_MASK;
  if (a >= 0x38800000u) {                 // f16 normal (>= 2^-14): rebias, round 13 mantissa bits away
    var h = (a - 0x38000000u) >> 13u;
    let rem = a & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) == 1u)) { h = h + 1u; }
    return sign | h;                      // a mantissa carry moves into the exponent correctly
  }
  let e = a >> 23u;
  if (e < 102u) { return sign; }          // < 2^-25: rounds to zero (f32 subnormals included)
  let sig = (a & 0x7FFFFFu) | 0x800000u;  // value = sig * 2^(e - 150); in units of 2^-24: sig >> (126 - e)
  let s = 126u - e;                       // 14 ..= 24
  var h = sig >> s;
  let rb = (sig >> (s - 1u)) & 1u;
  let low = sig & ((1u << (s - 1u)) - 1u);
  if (rb == 1u && (low != 0u || (h & 1u) == 1u)) { h = h + 1u; }
  return sign | h;                        // h == 1024 is the smallest normal: the encoding carries over
}

fn pack4(x: vec4<f32>) -> vec2<u32> {
  let b = bitcast<vec4<u32>>(x);
  return vec2<u32>(f16_bits(b.x) | (f16_bits(b.y) << 16u), f16_bits(b.z) | (f16_bits(b.w) << 16u));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let item = (wg.y * p.gx + wg.x) * 64u + lid;
  if (item >= p.items) { return; }
  let nv4 = p.hd / 4u;
  let row = item / nv4;
  let i = item % nv4;
  let slot = slots[row / p.kvh];
  if (slot == PAD_SLOT) { return; }
  let h = row % p.kvh;
  let dst = (((slot / p.bs) * p.kvh + h) * p.bs + slot % p.bs) * nv4 + i;
  k_cache[dst] = pack4(key_in[item]);
  v_cache[dst] = pack4(val_in[item]);
}
