// #include "common/quant.wgsl"
// int8_token writer (the seed WGSL quantiser's per-token int8, made valid and paged;
// docs/kernels.md, "Seed WGSL quantiser").
// One 64-thread workgroup per (token row, kv head, K|V): grid (rows, kv_heads, 2).
// Input key/value: [rows, kv_heads, head_size] f32. slots: [rows] u32 (PAD_SLOT = padding row, skipped).
// Cache (K and V): u32 [num_blocks, kv_heads, block_size, wpt], wpt = head_size/4 + 1:
//   words 0..hd/4-1: 4 int8 codes (element 4w+l in byte l), word hd/4: f32 bits of the scale.
// scale = max(amax / 127, 1e-8); code = clamp(round(x / scale), -128, 127) (see kvviz/families/int8/oracle.py).
// #include "common/writer_io.wgsl"
var<workgroup> s_red: array<u32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let t = wg.x;
  let h = wg.y;
  let which = wg.z;
  let tid = lid.x;
  let src = (t * p.kvh + h) * p.hd;
  let nw = p.hd / 4u;
  var m = 0u;                                   // max |x| as bits: unsigned order = float order for x >= 0
  for (var w = tid; w < nw; w = w + WG) {
    for (var l = 0u; l < 4u; l = l + 1u) { m = max(m, bitcast<u32>(load_x(which, src + 4u * w + l)) & ABS_MASK); }
  }
  s_red[tid] = m;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (tid < s) { s_red[tid] = max(s_red[tid], s_red[tid + s]); }
    workgroupBarrier();
  }
  let amax = bitcast<f32>(s_red[0]);
  let slot = slots[t];
  if (slot == PAD_SLOT) { return; }
  let scale = max(div_rn(amax, 127.0), 1e-8f);
  let dst = ((slot / p.bs) * p.kvh + h) * p.bs * p.wpt + (slot % p.bs) * p.wpt;
  for (var w = tid; w < nw; w = w + WG) {
    var word = 0u;
    for (var l = 0u; l < 4u; l = l + 1u) {
      let q = clamp(i32(round(div_rn(load_x(which, src + 4u * w + l), scale))), -128, 127);
      word = word | ((bitcast<u32>(q) & 0xFFu) << (8u * l));
    }
    store_w(which, dst + w, word);
  }
  if (tid == 0u) { store_w(which, dst + nw, bitcast<u32>(scale)); }
}
