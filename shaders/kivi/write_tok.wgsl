// #include "common/quant.wgsl"
// KIVI token writer ({{BITS}}-bit): one 64-thread workgroup per (token row, kv head): grid (rows, kv_heads, 1).
//  - residual row (row_res[t] != PAD_SLOT, position >= n_q of its sequence): K and V rows copied in f32 to
//    res[row_res[t], 0|1, head, :]; the slot's K code words and V record are zeroed;
//  - quantised row: V quantised per token (asymmetric over the head vector, 2^BITS-1 levels), record
//    [codes KW | scale | zero]; its K codes are written by kivi_write_kgroup.wgsl (per-channel groups).
// K buffer per (block, head): block_size*KW code words, then the side stream (kivi_write_kgroup.wgsl).
// V buffer per (block, head): block_size*(KW+2) words. KW = hd*BITS/32.
@group(0) @binding(0) var<storage, read> key_in: array<f32>;
@group(0) @binding(1) var<storage, read> val_in: array<f32>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read> row_res: array<u32>;
@group(0) @binding(4) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<u32>;
@group(0) @binding(6) var<storage, read_write> res: array<f32>;
struct P { kvh: u32, hd: u32, bs: u32, kstride: u32 }
var<immediate> p: P;
const WG: u32 = 64u;
const BITS: u32 = {{BITS}}u;
const LEVELS: u32 = (1u << BITS) - 1u;
const CPW: u32 = 32u / BITS;
var<workgroup> s_min: array<u32, 64>;
var<workgroup> s_max: array<u32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let t = wg.x;
  let h = wg.y;
  let tid = lid.x;
  let src = (t * p.kvh + h) * p.hd;
  var kmin = 0xFFFFFFFFu;
  var kmax = 0u;
  for (var d = tid; d < p.hd; d = d + WG) {
    let k = order_key(bitcast<u32>(val_in[src + d]));
    kmin = min(kmin, k);
    kmax = max(kmax, k);
  }
  s_min[tid] = kmin;
  s_max[tid] = kmax;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (tid < s) {
      s_min[tid] = min(s_min[tid], s_min[tid + s]);
      s_max[tid] = max(s_max[tid], s_max[tid + s]);
    }
    workgroupBarrier();
  }
  let slot = slots[t];
  if (slot == PAD_SLOT) { return; }
  let kw = p.hd * BITS / 32u;
  let kdst = ((slot / p.bs) * p.kvh + h) * p.kstride + (slot % p.bs) * kw;
  let vdst = ((slot / p.bs) * p.kvh + h) * p.bs * (kw + 2u) + (slot % p.bs) * (kw + 2u);
  let r = row_res[t];
  if (r != PAD_SLOT) {
    let rk = (r * 2u * p.kvh + h) * p.hd;
    let rv = ((r * 2u + 1u) * p.kvh + h) * p.hd;
    for (var d = tid; d < p.hd; d = d + WG) {
      res[rk + d] = key_in[src + d];
      res[rv + d] = val_in[src + d];
    }
    for (var w = tid; w < kw + 2u; w = w + WG) {
      if (w < kw) { k_cache[kdst + w] = 0u; }
      v_cache[vdst + w] = 0u;
    }
    return;
  }
  let mn = bitcast<f32>(key_bits(s_min[0]));
  let scale = asym_scale(mn, bitcast<f32>(key_bits(s_max[0])), LEVELS);
  for (var w = tid; w < kw; w = w + WG) {
    var word = 0u;
    for (var l = 0u; l < CPW; l = l + 1u) {
      word = word | (asym_code(val_in[src + w * CPW + l], mn, scale, LEVELS) << (BITS * l));
    }
    v_cache[vdst + w] = word;
  }
  if (tid == 0u) {
    v_cache[vdst + kw] = bitcast<u32>(scale);
    v_cache[vdst + kw + 1u] = bitcast<u32>(mn);
  }
}
