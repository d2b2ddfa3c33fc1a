// #include "common/quant.wgsl"
// #include "common/write_fast.wgsl"
// Fast NVFP4 writer: the record of fp4/nvfp4_write.wgsl (kvviz/families/fp4/format.py, oracle kvviz/families/fp4/oracle.py),
// the same words:
//   s_t = max(amax_tensor / 2688, 2^-126), amax_tensor in tensor[0|1] (K|V) from the amax pass
//         (fp8/amax_fast.wgsl); s_t's bits in tensor[2|3] (stored by fp4/nvfp4_scale_fast.wgsl, or by
//         this writer's first row where SCALE_PASS = 0);
//   sc = E4M3(div_rn(div_rn(max |x|, s_t), 6)) per 16 elements (RNE, saturating);
//   code = E2M1(div_rn(div_rn(x, s_t), e4m3(sc))) (RNE, saturating; 0 where e4m3(sc) = 0).
// The fast path (write_common.wgsl's rule, branch-free): the scale from q = max|x| * (1/s_t * 1/6) and the
// codes from q = |x| * (1/s_t * 1/e4m3), a few ulp from the exactly rounded quotients (at most ~14 ulp with
// a divider within 2.5 ulp), encoded on the float bits by round-half-up (e4m3_fast / codes4); an encoder
// is a step function whose steps (the rounding boundaries) sit at known bit patterns, so when q is farther
// than NEAR2 = 32 ulp from every boundary the code of q is the code of the exact quotient. Otherwise (within
// 32 ulp of a boundary, exact ties included; a boundary above E2M1's or E4M3's largest value is a harmless
// extra), or for a subnormal x or max |x| (which a GPU may flush), the group is marked and, after the lane's
// groups, redone exactly (exact_group: div_fast, div_rn's bits, and the f32_to_fp8 encoders). The sign bit
// is x's (-0 codes 8, as ml_dtypes).
// Record: ceil(hd/64) words of scale bytes, then hd/8 code words (byte i of sub-block s: element 16s+i
// low nibble | element 16s+8+i high nibble).
// Lanes: a lane owns NG = {{NG}} consecutive 16-element groups (a multiple of 4: whole scale words, 2 code
// words a group) of a (token, KV head) row, K and V together (a group of each an iteration: 8 16-B loads,
// no branch between them; the next group's are issued before one is encoded); nothing crosses lanes. Or
// NG = 1 or 2 (SUBW below): all of a lane's loads at once, the scale words put together by subgroup shuffles.
// L = {{LANES}} lanes a row (lanes past the row's groups idle), R = 64 / L rows a workgroup; grid 2-D.
@group(0) @binding(0) var<storage, read> key_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> val_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> tensor: array<u32>;
struct P { kvh: u32, hd: u32, bs: u32, wpt: u32, rows: u32, gx: u32 }
var<immediate> p: P;
const NG: u32 = {{NG}}u;
const SCALE_PASS: u32 = {{SCALE_PASS}}u;   // 1: s_t read from tensor[2|3] (fp4/nvfp4_scale_fast.wgsl ran first)
const E4M3_MAX_BITS: u32 = 0x43E00000u;  // 448
const E2M1_MAX_BITS: u32 = 0x40C00000u;  // 6
const INV6_BITS: u32 = 0x3E2AAAABu;      // 1/6 rounded to nearest
const NEAR2: u32 = 32u;                  // the fast path's margin, in ulp of the encoded value

// div_fast / div_fast_bits: common/quant.wgsl (div_rn_bits without its 25-step loop, the same bits).

fn e2m1_mag(bits: u32) -> u32 { return f32_to_fp8(bits & ABS_MASK, 1u, 1, E2M1_MAX_BITS, 7u) & 7u; }

// E4M3 code of q >= 0 (x) and 1 where q is within NEAR2 ulp of a rounding boundary (y). The boundaries:
// q >= 2^-6 (E4M3 normal, 3 mantissa bits): the points whose low 20 bits are 0x80000 (above 448: none,
// the code saturates; such points only mark more groups for the exact path); q < 2^-6 (subnormal, steps
// of 2^-9): q + 2^-6 (rounded, or fused: within 8 ulp of the exact sum) lies in [2^-6, 2^-5] where the
// E4M3 grid is the same 2^-9, so its bits less 2^23 (the value halved) take the same formula.
fn e4m3_fast(q: f32) -> vec2<u32> {
  let qb = bitcast<u32>(q);
  let u = select(qb, bitcast<u32>(q + 0.015625) - 0x800000u, qb < 0x3C800000u);
  let c = min((u + 0x80000u) >> 20u, 0x43Eu) - 0x3C0u;
  return vec2<u32>(c, select(0u, 1u, ((u + 0x80000u + NEAR2) & 0xFFFFFu) <= 2u * NEAR2));
}

// The value of an E4M3 code (sign 0): fp8_to_f32(sc, 3, 7), branch-free.
fn e4m3_value(sc: u32) -> f32 {
  return select(f32(sc) * 0.001953125, bitcast<f32>((sc + 0x3C0u) << 20u), sc >= 8u);
}

// E2M1 codes (sign in bit 3) of x / (s_t e) for 4 values from a = |x| * sie (sie ~ 1 / (s_t e)); bit 8 set
// where a is within NEAR2 ulp of a rounding boundary or x is subnormal. The boundaries: a >= 1 (E2M1
// normal, 1 mantissa bit): the points whose low 22 bits are 0x200000 (1.25, 1.75, 2.5, 3.5, 5; 7, 10, ...
// past 6 are extra); a < 1 (0.25, 0.75): a + 1 (steps of 0.5 on [1, 2] as on [0, 1]) at 1.25 and 1.75,
// its bits less 2^23 giving the code by the same formula.
fn codes4(x: vec4<f32>, sie: f32) -> vec4<u32> {
  let xb = bitcast<vec4<u32>>(x);
  let ax = xb & vec4<u32>(ABS_MASK);
  let a = bitcast<vec4<f32>>(ax) * sie;
  let ab = bitcast<vec4<u32>>(a);
  let u = select(ab, bitcast<vec4<u32>>(a + vec4<f32>(1.0)) - vec4<u32>(0x800000u), ab < vec4<u32>(0x3F800000u));
  let c = min((u + vec4<u32>(0x200000u)) >> vec4<u32>(22u), vec4<u32>(259u)) - vec4<u32>(252u);
  let near = ((u + vec4<u32>(0x200000u + NEAR2)) & vec4<u32>(0x3FFFFFu)) <= vec4<u32>(2u * NEAR2);
  let sub = (ax - vec4<u32>(1u)) < vec4<u32>(F32_MIN_NORMAL_BITS - 1u);
  return c | ((xb >> vec4<u32>(28u)) & vec4<u32>(8u)) | select(vec4<u32>(0u), vec4<u32>(0x100u), near | sub);
}

fn nibbles(lo: vec4<u32>, hi: vec4<u32>) -> u32 {
  let b = (lo & vec4<u32>(15u)) | ((hi & vec4<u32>(15u)) << vec4<u32>(4u));
  return b.x | (b.y << 8u) | (b.z << 16u) | (b.w << 24u);
}

// A group's two code words, its scale code and whether the exact path must redo it (fix 1).
struct Grp { w0: u32, w1: u32, sc: u32, fix: u32 }

fn group(x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>, ist: f32) -> Grp {
  let am = vec4<u32>(ABS_MASK);   // max |x| on the bits (no float max: a GPU may flush subnormals)
  let a4 = max(max(bitcast<vec4<u32>>(x0) & am, bitcast<vec4<u32>>(x1) & am),
               max(bitcast<vec4<u32>>(x2) & am, bitcast<vec4<u32>>(x3) & am));
  let m = max(max(a4.x, a4.y), max(a4.z, a4.w));
  let s = e4m3_fast(bitcast<f32>(m) * (ist * bitcast<f32>(INV6_BITS)));
  var g: Grp;
  g.sc = s.x;
  let sie = ist * approx_inv(e4m3_value(s.x));
  let c0 = codes4(x0, sie);
  let c1 = codes4(x1, sie);
  let c2 = codes4(x2, sie);
  let c3 = codes4(x3, sie);
  let ok = s.x != 0u;   // a zero scale: codes 0
  g.w0 = select(0u, nibbles(c0, c2), ok);
  g.w1 = select(0u, nibbles(c1, c3), ok);
  let und = ((c0 | c1 | c2 | c3) & vec4<u32>(0x100u)) != vec4<u32>(0u);
  g.fix = select(0u, 1u, s.y != 0u || (m - 1u) < F32_MIN_NORMAL_BITS - 1u || (ok && any(und)));
  return g;
}

fn load_x(which: u32, i: u32) -> vec4<f32> {
  if (which == 0u) { return key_in[i]; }
  return val_in[i];
}

fn load_group(which: u32, i: u32) -> array<vec4<f32>, 4> {
  return array<vec4<f32>, 4>(load_x(which, i), load_x(which, i + 1u), load_x(which, i + 2u), load_x(which, i + 3u));
}

// The exact path: the group at vec4 xi of K (which 0) or V with the reference's arithmetic (both divisions
// correctly rounded, the f32_to_fp8 encoders): its code words and scale code (fix 0).
fn exact_grp(which: u32, xi: u32, st: f32) -> Grp {
  var m = 0u;
  for (var j = 0u; j < 4u; j = j + 1u) {
    let a = bitcast<vec4<u32>>(load_x(which, xi + j)) & vec4<u32>(ABS_MASK);
    m = max(m, max(max(a.x, a.y), max(a.z, a.w)));
  }
  let sc = f32_to_fp8(div_fast_bits(div_fast(bitcast<f32>(m), st), 6.0), 3u, 7, E4M3_MAX_BITS, 0x7Eu);
  var w0 = 0u;
  var w1 = 0u;
  if (sc != 0u) {
    let e = fp8_to_f32(sc, 3u, 7);
    for (var i = 0u; i < 16u; i = i + 1u) {   // element i: byte i % 8 (w0: 0..3), high nibble for i >= 8
      let xe = load_x(which, xi + i / 4u)[i % 4u];
      let c = e2m1_mag(div_fast_bits(div_fast(xe, st), e)) | ((bitcast<u32>(xe) >> 28u) & 8u);
      let pos = 8u * (i % 4u) + 4u * (i / 8u);
      if (i % 8u < 4u) { w0 = w0 | (c << pos); } else { w1 = w1 | (c << pos); }
    }
  }
  return Grp(w0, w1, sc, 0u);
}

// The exact path of group g (first vec4 xi) written over the fast path's words: its code words and its scale byte.
fn exact_group(which: u32, xi: u32, st: f32, base: u32, sw: u32, g: u32) {
  let e = exact_grp(which, xi, st);
  let cw = base + sw + 2u * g;
  let wi = base + g / 4u;
  let keep = ~(0xFFu << (8u * (g % 4u)));
  let sb = e.sc << (8u * (g % 4u));
  put_word(which, cw, e.w0);
  put_word(which, cw + 1u, e.w1);
  put_word(which, wi, (rec_word(which, wi) & keep) | sb);
}

// STAGE = 1: a lane's words go to workgroup memory at its row's place (SOK / SOV, `base` = the row's offset
// there), each row's record start to SD, and after a barrier the 64 threads store the workgroup's R records
// word by word (thread j: words j, j + 64, ...), consecutive threads at consecutive words, instead of each
// lane storing 4-byte words 8 words apart. STAGE = 0: `base` is the record's offset in the cache.
const STAGE: u32 = {{STAGE}}u;
const WPR: u32 = {{WPR}}u;   // words of a record
const NO_ROW: u32 = 0xFFFFFFFFu;
const STORES: u32 = (R * WPR + 63u) / 64u;   // the staged stores a thread makes
var<workgroup> SOK: array<u32, {{SO_LEN}}>;
var<workgroup> SOV: array<u32, {{SO_LEN}}>;
var<workgroup> SD: array<u32, {{SD_LEN}}>;

fn put_word(which: u32, i: u32, w: u32) {
  if (STAGE == 1u) {
    if (which == 0u) { SOK[i] = w; } else { SOV[i] = w; }
  } else if (which == 0u) { k_cache[i] = w; } else { v_cache[i] = w; }
}

fn rec_word(which: u32, i: u32) -> u32 {
  if (STAGE == 1u) {
    if (which == 0u) { return SOK[i]; }
    return SOV[i];
  }
  if (which == 0u) { return k_cache[i]; }
  return v_cache[i];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let row = (wg.y * p.gx + wg.x) * R + lid / L;
  let lane = lid % L;
  let ns = p.hd / 16u;
  let which = select(0u, lane & 1u, KVS == 1u);   // KVS: K on the even lanes, V on the odd ones
  let g0 = select(lane, lane >> 1u, KVS == 1u) * NG;
  var stb: vec2<u32>;
  if (SCALE_PASS == 1u) {   // s_t from fp4/nvfp4_scale_fast.wgsl
    stb = vec2<u32>(tensor[2], tensor[3]);
  } else {   // each thread derives s_t (the same bits)
    stb = nvfp4_tensor_scale_bits(vec2<u32>(tensor[0], tensor[1]));
    if (row == 0u && lane == 0u) {
      tensor[2] = stb.x;
      tensor[3] = stb.y;
    }
  }
  let live = row < p.rows && g0 < ns;
  if (STAGE == 0u && !live) { return; }   // (STAGE: every thread reaches the barrier)
  let t = select(0u, row / p.kvh, live);
  let h = row % p.kvh;
  let slot = slots[t];
  let store = live && slot != PAD_SLOT;
  if (STAGE == 0u && !store) { return; }
  let rec = ((slot / p.bs) * p.kvh + h) * p.bs * p.wpt + (slot % p.bs) * p.wpt;
  let rl = lid / L;
  let base = select(rec, rl * WPR, STAGE == 1u);
  if (SUBW == 1u) {
    var sc = vec2<u32>(0u);
    if (store) { sc = encode_sub(row, g0, ns, base, stb, which); }
    // a scale word's 4 bytes come from 4 / NG neighbouring lanes of the row (of its tensor, with KVS): OR-ed together
    // by shuffles that every thread makes (idle lanes add 0)
    let m = 1u + KVS;
    sc = shuf_or(sc, m);
    if (NG == 1u) { sc = shuf_or(sc, 2u * m); }
    if (store && g0 % 4u == 0u) {
      put_word(which, base + g0 / 4u, sc.x);
      if (KVS == 0u) { put_word(1u, base + g0 / 4u, sc.y); }
    }
  } else if (store) { encode(row, g0, ns, base, stb); }
  if (STAGE == 1u) {
    if (lane == 0u) { SD[rl] = select(NO_ROW, rec, store); }
    workgroupBarrier();
    // @unroll
    for (var j = 0u; j < STORES; j = j + 1u) {   // straight-line: naga bounds a loop, so a loop stays a loop
      let n = lid + 64u * j;
      let d = SD[min(n / WPR, R - 1u)];
      if (n < R * WPR && d != NO_ROW) {
        k_cache[d + n % WPR] = SOK[n];
        v_cache[d + n % WPR] = SOV[n];
      }
    }
  }
}

// SUBW = 1 (NG = 1 or 2 groups a lane, head sizes a multiple of 64): the lane loads its groups of K and V at
// once (8 NG vec4s), encodes each (a group the fast path marks is redone by exact_grp in place, before any word
// is written, so no two lanes rewrite one scale word), puts its code words and returns its scale bytes at their
// places in the scale words (main ORs them across the lanes of a word). Lanes a row: 8 / NG at head size 128,
// against 2 lanes of NG = 4 groups walked one after the other (SUBW = 0).
// KVS = 1: K and V on separate lanes (2 x the lanes a row, half the loads and encodes a lane): the lane's tensor is
// `which`, its scale bytes in the result's x.
const SUBW: u32 = {{SUBW}}u;
const KVS: u32 = {{KVS}}u;
const TPL: u32 = 2u - KVS;   // tensors a lane
fn shuf_or(v: vec2<u32>, m: u32) -> vec2<u32> { {{SHUF_OR}} }

fn encode_sub(row: u32, g0: u32, ns: u32, base: u32, stb: vec2<u32>, which: u32) -> vec2<u32> {
  let sw = (ns + 3u) / 4u;
  let src = row * (p.hd / 4u) + 4u * g0;
  var x: array<array<array<vec4<f32>, 4>, NG>, TPL>;
  // @unroll
  for (var t = 0u; t < TPL; t = t + 1u) {
    // @unroll
    for (var k = 0u; k < NG; k = k + 1u) { x[t][k] = load_group(which + t, src + 4u * k); }
  }
  var sc = vec2<u32>(0u);
  // @unroll
  for (var t = 0u; t < TPL; t = t + 1u) {
    let w = which + t;
    let st = bitcast<f32>(stb[w]);
    let ist = approx_inv(st);
    // @unroll
    for (var k = 0u; k < NG; k = k + 1u) {
      var g = group(x[t][k][0], x[t][k][1], x[t][k][2], x[t][k][3], ist);
      if (g.fix != 0u) { g = exact_grp(w, src + 4u * k, st); }
      let cw = base + sw + 2u * (g0 + k);
      put_word(w, cw, g.w0);
      put_word(w, cw + 1u, g.w1);
      sc[t] = sc[t] | (g.sc << (8u * ((g0 + k) % 4u)));
    }
  }
  return sc;
}

// The lane's groups g0 .. of row `row`, K and V, their words put at `base` (put_word: the cache or workgroup memory).
fn encode(row: u32, g0: u32, ns: u32, base: u32, stb: vec2<u32>) {
  let sw = (ns + 3u) / 4u;
  let src = row * (p.hd / 4u) + 4u * g0;
  let stk = bitcast<f32>(stb.x);
  let stv = bitcast<f32>(stb.y);
  let istk = approx_inv(stk);
  let istv = approx_inv(stv);
  var sck = 0u;   // the scale words being built
  var scv = 0u;
  var fixk = 0u;  // bit k % 32: group g0 + k needs the exact path
  var fixv = 0u;
  // software-pipelined: group k + 1's 8 vec4s are loaded before group k is encoded (two groups in flight)
  var kx = load_group(0u, src);
  var vx = load_group(1u, src);
  for (var k = 0u; k < NG; k = k + 1u) {
    if (g0 + k >= ns) { break; }
    var nk: array<vec4<f32>, 4>;
    var nv: array<vec4<f32>, 4>;
    if (k + 1u < NG && g0 + k + 1u < ns) {
      nk = load_group(0u, src + 4u * (k + 1u));
      nv = load_group(1u, src + 4u * (k + 1u));
    }
    let gk = group(kx[0], kx[1], kx[2], kx[3], istk);
    let gv = group(vx[0], vx[1], vx[2], vx[3], istv);
    kx = nk;
    vx = nv;
    let sh = 8u * (k % 4u);
    sck = sck | (gk.sc << sh);
    scv = scv | (gv.sc << sh);
    fixk = fixk | (gk.fix << (k % 32u));
    fixv = fixv | (gv.fix << (k % 32u));
    let cw = base + sw + 2u * (g0 + k);
    put_word(0u, cw, gk.w0);
    put_word(0u, cw + 1u, gk.w1);
    put_word(1u, cw, gv.w0);
    put_word(1u, cw + 1u, gv.w1);
    if (k % 4u == 3u || g0 + k + 1u == ns) {
      let w = base + (g0 + k) / 4u;
      put_word(0u, w, sck);
      put_word(1u, w, scv);
      sck = 0u;
      scv = 0u;
    }
  }
  if ((fixk | fixv) != 0u) {   // rare: a code or scale within NEAR2 ulp of a rounding boundary, subnormals
    for (var k = 0u; k < NG; k = k + 1u) {
      if (g0 + k >= ns) { break; }
      let bit = 1u << (k % 32u);   // NG > 32: groups k, k + 32, ... share a bit (redoing more is harmless)
      if ((fixk & bit) != 0u) { exact_group(0u, src + 4u * k, stk, base, sw, g0 + k); }
      if ((fixv & bit) != 0u) { exact_group(1u, src + 4u * k, stv, base, sw, g0 + k); }
    }
  }
}
