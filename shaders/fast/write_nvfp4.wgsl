// #include "quant/common.wgsl"
// #include "fast/write_common.wgsl"
// Fast NVFP4 writer: the record of fp4/nvfp4_write.wgsl (kvviz/formats/fp4.py, oracle kvviz/oracles/fp4.py),
// the same words:
//   s_t = max(amax_tensor / 2688, 2^-126), amax_tensor in tensor[0|1] (K|V) from the amax pass
//         (fast/write_fp8_amax.wgsl); the writer stores s_t's bits in tensor[2|3];
//   sc = E4M3(div_rn(div_rn(max |x|, s_t), 6)) per 16 elements (RNE, saturating);
//   code = E2M1(div_rn(div_rn(x, s_t), e4m3(sc))) (RNE, saturating; 0 where e4m3(sc) = 0).
// The codes: q = (x * (1/s_t)) * (1/e4m3) on the hardware, the E2M1 encoder evaluated at |q| - 16 ulp and
// |q| + 16 ulp; where both agree that is the code of the exactly rounded quotient (a few ulp from q, the
// encoder monotone), otherwise (within 16 ulp of a rounding boundary, exact ties included) or for a
// subnormal x the exact divisions decide (write_common.wgsl). The sign bit is x's (-0 codes 8, as ml_dtypes).
// Record: ceil(hd/64) words of scale bytes, then hd/8 code words (byte i of sub-block s: element 16s+i
// low nibble | element 16s+8+i high nibble).
// Lanes: a lane owns NG = {{NG}} consecutive 16-element groups (a multiple of 4: whole scale words, 2 code
// words a group) of a (token, KV head) row, K and V one after the other; nothing crosses lanes. L =
// {{LANES}} lanes a row (lanes past the row's groups idle), R = 64 / L rows a workgroup; grid 2-D.
@group(0) @binding(0) var<storage, read> key_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> val_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> tensor: array<u32>;
struct P { kvh: u32, hd: u32, bs: u32, wpt: u32, rows: u32, gx: u32 }
var<immediate> p: P;
const NG: u32 = {{NG}}u;
const E4M3_MAX_BITS: u32 = 0x43E00000u;  // 448
const E2M1_MAX_BITS: u32 = 0x40C00000u;  // 6

fn e2m1_mag(bits: u32) -> u32 { return f32_to_fp8(bits & ABS_MASK, 1u, 1, E2M1_MAX_BITS, 7u) & 7u; }

// E2M1 codes (sign in bit 3) of div_rn(div_rn(x, st), e) for 4 values from q = (x * ist) * ie (ist ~ 1/st,
// ie ~ 1/e); bit 8 set where the 16-ulp check cannot decide (or x is subnormal): the exact path redoes those.
fn codes4(x: vec4<f32>, ist: f32, ie: f32) -> vec4<u32> {
  let xb = bitcast<vec4<u32>>(x);
  let sg = select(vec4<u32>(0u), vec4<u32>(8u), (xb & vec4<u32>(SIGN_BIT)) != vec4<u32>(0u));
  let m = bitcast<vec4<u32>>((x * ist) * ie) & vec4<u32>(ABS_MASK);
  let lo = near_lo(m);
  let hi = near_hi(m);
  let a = vec4<u32>(e2m1_mag(lo.x), e2m1_mag(lo.y), e2m1_mag(lo.z), e2m1_mag(lo.w));
  let b = vec4<u32>(e2m1_mag(hi.x), e2m1_mag(hi.y), e2m1_mag(hi.z), e2m1_mag(hi.w));
  let ab = xb & vec4<u32>(ABS_MASK);
  let sub = (ab != vec4<u32>(0u)) & (ab < vec4<u32>(F32_MIN_NORMAL_BITS));
  return a | sg | select(vec4<u32>(0u), vec4<u32>(0x100u), (a != b) | sub);
}

fn nibbles(lo: vec4<u32>, hi: vec4<u32>) -> u32 {
  let b = lo | (hi << vec4<u32>(4u));
  return b.x | (b.y << 8u) | (b.z << 16u) | (b.w << 24u);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let row = (wg.y * p.gx + wg.x) * R + lid / L;
  let lane = lid % L;
  let ns = p.hd / 16u;
  let g0 = lane * NG;
  var stb = vec2<u32>(div_rn_bits(bitcast<f32>(tensor[0]), 2688.0), div_rn_bits(bitcast<f32>(tensor[1]), 2688.0));
  stb = max(stb, vec2<u32>(F32_MIN_NORMAL_BITS));
  if (row == 0u && lane == 0u) {
    tensor[2] = stb.x;
    tensor[3] = stb.y;
  }
  if (row >= p.rows || g0 >= ns) { return; }
  let t = row / p.kvh;
  let h = row % p.kvh;
  let slot = slots[t];
  if (slot == PAD_SLOT) { return; }
  let base = ((slot / p.bs) * p.kvh + h) * p.bs * p.wpt + (slot % p.bs) * p.wpt;
  let sw = (ns + 3u) / 4u;
  let src = row * (p.hd / 4u) + 4u * g0;
  for (var which = 0u; which < 2u; which = which + 1u) {   // K, then V (not unrolled: one copy of the code)
    let st = bitcast<f32>(select(stb.y, stb.x, which == 0u));
    let ist = approx_inv(st);
    var scw = 0u;
    for (var k = 0u; k < NG; k = k + 1u) {                      // not unrolled: the exact path stays one copy
      if (g0 + k >= ns) { break; }
      var x: array<vec4<f32>, 4>;
      // @unroll
      for (var j = 0u; j < 4u; j = j + 1u) {
        if (which == 0u) { x[j] = key_in[src + 4u * k + j]; } else { x[j] = val_in[src + 4u * k + j]; }
      }
      let am = vec4<u32>(ABS_MASK);   // max |x| on the bits (no float max: a GPU may flush subnormals)
      let a4 = max(max(bitcast<vec4<u32>>(x[0]) & am, bitcast<vec4<u32>>(x[1]) & am),
                   max(bitcast<vec4<u32>>(x[2]) & am, bitcast<vec4<u32>>(x[3]) & am));
      let m = bitcast<f32>(max(max(a4.x, a4.y), max(a4.z, a4.w)));
      let sc = f32_to_fp8(div_rn_bits(div_rn(m, st), 6.0), 3u, 7, E4M3_MAX_BITS, 0x7Eu);
      scw = scw | (sc << (8u * (k % 4u)));
      var w0 = 0u;
      var w1 = 0u;
      if (sc != 0u) {
        let e = fp8_to_f32(sc, 3u, 7);
        let ie = approx_inv(e);
        let c0 = codes4(x[0], ist, ie);
        let c1 = codes4(x[1], ist, ie);
        let c2 = codes4(x[2], ist, ie);
        let c3 = codes4(x[3], ist, ie);
        w0 = nibbles(c0 & vec4<u32>(15u), c2 & vec4<u32>(15u));
        w1 = nibbles(c1 & vec4<u32>(15u), c3 & vec4<u32>(15u));
        let amb = (c0 | c1 | c2 | c3) & vec4<u32>(0x100u);
        if (any(amb != vec4<u32>(0u))) {
          // the exact divisions for the undecided elements (element i: byte i % 8, high nibble for i >= 8)
          for (var i = 0u; i < 16u; i = i + 1u) {
            let j = i / 4u;
            let xv = select(select(x[0], x[1], j == 1u), select(x[2], x[3], j == 3u), j >= 2u);
            let cv = select(select(c0, c1, j == 1u), select(c2, c3, j == 3u), j >= 2u);
            if ((cv[i % 4u] & 0x100u) != 0u) {
              let xe = xv[i % 4u];
              let c = e2m1_mag(div_rn_bits(div_rn(xe, st), e)) | select(0u, 8u, (bitcast<u32>(xe) & SIGN_BIT) != 0u);
              let e8 = (j % 2u) * 4u + i % 4u;     // element's byte in the sub-block: 0..7 (j 0, 1: low; 2, 3: high)
              let pos = 8u * (e8 % 4u) + 4u * (j / 2u);
              let mask = ~(15u << pos);
              if (e8 < 4u) { w0 = (w0 & mask) | (c << pos); } else { w1 = (w1 & mask) | (c << pos); }
            }
          }
        }
      }
      let cw = base + sw + 2u * (g0 + k);
      if (which == 0u) { k_cache[cw] = w0; k_cache[cw + 1u] = w1; } else { v_cache[cw] = w0; v_cache[cw + 1u] = w1; }
      if (k % 4u == 3u || g0 + k + 1u == ns) {
        let w = (g0 + k) / 4u;
        if (which == 0u) { k_cache[base + w] = scw; } else { v_cache[base + w] = scw; }
        scw = 0u;
      }
    }
  }
}
