// #include "common/quant.wgsl"
// #include "common/write_fast.wgsl"
// #include "common/write_redo.wgsl"
// Fast int8 writer, SEED = {{SEED}}: the per-token int8 record [hd/4 code words | f32 scale word] of
//   SEED = false: int8_token (int8/write.wgsl): scale = max(amax / 127, 1e-8),
//                 code = clamp(round(x / scale), -128, 127);
//   SEED = true : the seed GLSL writer attention/reshape_and_cache_q8.comp: inv = 127 / amax, code =
//                 clamp(round(x * inv), -127, 127), scale = amax / 127 (1 and codes 0 when amax = 0);
//                 127 / amax and amax / 127 divided exactly (kvviz/attention/paged_oracle.py's float32 arithmetic).
// One lane group of L lanes per (token, KV head) row, K and V together: lane l loads the vec4s
// l, l + L, ... of the row (NV = hd / (4L) each), amax by red_min2, codes packed with pack4xI8 (int8_token:
// branch-free by round_fixed4, a lane's unsure words redone by common/write_redo.wgsl).
// Cache u32 [num_blocks, kv_heads, block_size, wpt], wpt = hd/4 + 1; PAD_SLOT rows are skipped.
@group(0) @binding(0) var<storage, read> key_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> val_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<u32>;
struct P { kvh: u32, hd: u32, bs: u32, wpt: u32, rows: u32, gx: u32 }
var<immediate> p: P;
const SEED: bool = {{SEED}};
const NV: u32 = {{NV}}u;
// PAD: the L lanes take NV vec4s each that cover more than the row (a row of vec4s no power of two <= L divides
// into few enough): a lane's vec4s past the row are neither loaded (zero: the amax is unchanged) nor written
const PAD: bool = {{PAD}};

// The exact codes of 4 values (round_div4: its fast path, else div_rn an element at a time).
fn codes(x: vec4<f32>, scale: f32, inv: f32) -> u32 {
  if (SEED) { return fast_codes(x, inv).x; }
  return pack4xI8(clamp(vec4<i32>(round_div4(x, scale, inv)), vec4<i32>(-128), vec4<i32>(127)));
}

// (word, 1 when sure): the branch-free codes of the main loop (round_fixed4); the seed's are always exact
// (round(x * inv), the seed's own arithmetic).
fn fast_codes(x: vec4<f32>, inv: f32) -> vec2<u32> {
  if (SEED) { return vec2<u32>(pack4xI8(clamp(vec4<i32>(round(x * inv)), vec4<i32>(-127), vec4<i32>(127))), 1u); }
  let r = round_fixed4(x * inv, 7u);
  return vec2<u32>(pack4xI8(clamp(r.n, vec4<i32>(-128), vec4<i32>(127))), select(0u, 1u, r.sure));
}

fn scale_inv(amax: f32) -> vec2<f32> {
  if (SEED) {
    if (amax > 0.0) { return vec2<f32>(div_fast(amax, 127.0), div_fast(127.0, amax)); }
    return vec2<f32>(1.0, 0.0);
  }
  let s = max(div_fast(amax, 127.0), 1e-8f);
  return vec2<f32>(s, approx_inv(s));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let row = (wg.y * p.gx + wg.x) * R + lid / L;
  let lane = lid % L;
  let live = row < p.rows;
  let nv4 = p.hd / 4u;
  let src = row * nv4 + lane;
  let nvl = select(NV, (max(nv4, lane) - lane + L - 1u) / L, PAD);  // the lane's vec4s in the row
  var xk: array<vec4<f32>, NV>;
  var xv: array<vec4<f32>, NV>;
  var m = vec2<u32>(0xFFFFFFFFu);
  // @unroll
  for (var j = 0u; j < NV; j = j + 1u) {
    if (live && j < nvl) {
      xk[j] = key_in[src + j * L];
      xv[j] = val_in[src + j * L];
    }
    m = min(m, vec2<u32>(amax_key4(xk[j]), amax_key4(xv[j])));
  }
  m = red_min2(m, lid, L);
  if (!live) { return; }
  let t = row / p.kvh;
  let h = row % p.kvh;
  let slot = slots[t];
  if (slot == PAD_SLOT) { return; }
  let sk = scale_inv(bitcast<f32>(~m.x));
  let sv = scale_inv(bitcast<f32>(~m.y));
  let dst = ((slot / p.bs) * p.kvh + h) * p.bs * p.wpt + (slot % p.bs) * p.wpt;
  var sure = 1u;
  // @unroll
  for (var j = 0u; j < NV; j = j + 1u) {
    let wk = fast_codes(xk[j], sk.y);
    let wv = fast_codes(xv[j], sv.y);
    if (j < nvl) {
      k_cache[dst + lane + j * L] = wk.x;
      v_cache[dst + lane + j * L] = wv.x;
      sure = sure & wk.y & wv.y;
    }
  }
  // rare (a quotient within 16 ulp of a rounding boundary, a subnormal value): the lane's unsure words again
  if (sure == 0u) { redo_unsure(src, dst + lane, nvl, sk.x, sk.y, sv.x, sv.y); }
  if (lane == 0u) {
    k_cache[dst + nv4] = bitcast<u32>(sk.x);
    v_cache[dst + nv4] = bitcast<u32>(sv.x);
  }
}
