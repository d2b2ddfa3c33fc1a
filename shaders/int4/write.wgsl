// #include "common/quant.wgsl"
// int4_group writer: asymmetric 4-bit codes per group of G = {{GROUP}} consecutive elements of a
// token's head vector (the seed WGSL quantiser's INT4, made valid, packed 8 codes a word, paged;
// docs/kernels.md, "Seed WGSL quantiser").
// One 64-thread workgroup per (token row, kv head, K|V): grid (rows, kv_heads, 2).
// Record (wpt = hd/8 + 2*hd/G u32 words): words 0..hd/8-1 codes (element 8w+l in bits 4l..4l+3);
// then per group g: word hd/8+2g = scale bits, word hd/8+2g+1 = zero bits (the group minimum).
// scale = (max-min)/15 (0 when max-min < 2^-100), code = clamp(round((x-min)/scale), 0, 15);
// dequantised = code*scale + min (kvviz/families/int4/oracle.py).
// #include "common/writer_io.wgsl"
const G: u32 = {{GROUP}}u;
var<workgroup> s_scale: array<f32, 8>;   // hd <= 256, G >= 32: at most 8 groups
var<workgroup> s_zero: array<f32, 8>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let t = wg.x;
  let h = wg.y;
  let which = wg.z;
  let tid = lid.x;
  let src = (t * p.kvh + h) * p.hd;
  let ng = p.hd / G;
  let slot = slots[t];
  let real = slot != PAD_SLOT;
  let dst = ((slot / p.bs) * p.kvh + h) * p.bs * p.wpt + (slot % p.bs) * p.wpt;
  if (tid < ng) {
    var kmin = 0xFFFFFFFFu;
    var kmax = 0u;
    for (var i = 0u; i < G; i = i + 1u) {
      let k = order_key(bitcast<u32>(load_x(which, src + tid * G + i)));
      kmin = min(kmin, k);
      kmax = max(kmax, k);
    }
    let mn = bitcast<f32>(key_bits(kmin));
    let scale = asym_scale(mn, bitcast<f32>(key_bits(kmax)), 15u);
    s_scale[tid] = scale;
    s_zero[tid] = mn;
    if (real) {
      store_w(which, dst + p.hd / 8u + 2u * tid, bitcast<u32>(scale));
      store_w(which, dst + p.hd / 8u + 2u * tid + 1u, bitcast<u32>(mn));
    }
  }
  workgroupBarrier();
  if (!real) { return; }
  for (var w = tid; w < p.hd / 8u; w = w + WG) {
    let g = (8u * w) / G;
    let scale = s_scale[g];
    let mn = s_zero[g];
    var word = 0u;
    for (var l = 0u; l < 8u; l = l + 1u) {
      word = word | (asym_code(load_x(which, src + 8u * w + l), mn, scale, 15u) << (4u * l));
    }
    store_w(which, dst + w, word);
  }
}
