// #include "ggml/common.wgsl"
// NVFP4 writer (kvviz/families/fp4/format.py, oracle kvviz/families/fp4/oracle.py): E2M1 codes, an E4M3 scale per 16
// consecutive elements of a token's head vector, one f32 scale per tensor (K, V).
//   s_t = max(amax_tensor / 2688, 2^-126), amax_tensor from fp8/amax.wgsl in tensor[0|1] (K|V);
//         the writer stores s_t's bits in tensor[2|3];
//   y = x / s_t; sc = E4M3(max|y| / 6) (RNE, saturating); code = E2M1(y / e4m3(sc)) (RNE, saturating;
//   0 where e4m3(sc) = 0). Every division correctly rounded (div_rn), the encoders on the bits
//   (f32_to_fp8 with E4M3's and E2M1's parameters), so the record is bit-identical to the oracle.
// Record: ceil(hd/64) words of scale bytes, then hd/8 code words (8 bytes a sub-block: byte i = element
// 16s+i low nibble | element 16s+8+i high nibble). Grid (rows, kv_heads, 2), 64 threads.
// #include "common/writer_io.wgsl"
@group(0) @binding(5) var<storage, read_write> tensor: array<u32>;
const E4M3_MAX_BITS: u32 = 0x43E00000u;  // 448
const E2M1_MAX_BITS: u32 = 0x40C00000u;  // 6
var<workgroup> s_sc: array<u32, 16>;     // E4M3 scale codes (hd <= 256)
var<workgroup> s_code: array<u32, 256>;

fn e2m1_code(y: f32) -> u32 {
  let c = f32_to_fp8(bitcast<u32>(y), 1u, 1, E2M1_MAX_BITS, 7u);   // sign in bit 7
  return (c & 7u) | ((c >> 4u) & 8u);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let t = wg.x;
  let h = wg.y;
  let which = wg.z;
  let tid = lid.x;
  let src = (t * p.kvh + h) * p.hd;
  let ns = p.hd / 16u;
  let slot = slots[t];
  var st_bits = div_rn_bits(bitcast<f32>(tensor[which]), 2688.0);
  if (st_bits < F32_MIN_NORMAL_BITS) { st_bits = F32_MIN_NORMAL_BITS; }
  let st = bitcast<f32>(st_bits);
  if (t == 0u && h == 0u && tid == 0u) { tensor[2u + which] = st_bits; }
  if (tid < ns) {
    var m = 0u;
    for (var j = 0u; j < 16u; j = j + 1u) { m = max(m, bitcast<u32>(load_x(which, src + 16u * tid + j)) & ABS_MASK); }
    let sf = div_rn(div_rn(bitcast<f32>(m), st), 6.0);
    s_sc[tid] = f32_to_fp8(bitcast<u32>(sf), 3u, 7, E4M3_MAX_BITS, 0x7Eu);
  }
  workgroupBarrier();
  for (var i = tid; i < p.hd; i = i + WG) {
    let sc = s_sc[i / 16u];
    var c = 0u;
    if (sc != 0u) { c = e2m1_code(div_rn(div_rn(load_x(which, src + i), st), fp8_to_f32(sc, 3u, 7))); }
    s_code[i] = c;
  }
  workgroupBarrier();
  if (slot == PAD_SLOT) { return; }
  let dst = ((slot / p.bs) * p.kvh + h) * p.bs * p.wpt + (slot % p.bs) * p.wpt;
  let sw = (ns + 3u) / 4u;
  for (var w = tid; w < p.wpt; w = w + WG) {
    var word = 0u;
    if (w < sw) {
      for (var l = 0u; l < 4u; l = l + 1u) {
        if (4u * w + l < ns) { word = word | (s_sc[4u * w + l] << (8u * l)); }
      }
    } else {
      let cw = w - sw;
      let s = cw / 2u;
      for (var l = 0u; l < 4u; l = l + 1u) {
        let i = 4u * (cw % 2u) + l;
        word = word | ((s_code[16u * s + i] | (s_code[16u * s + 8u + i] << 4u)) << (8u * l));
      }
    }
    store_w(which, dst + w, word);
  }
}
