// ---- shaders/common/write_fast.wgsl: what every fast writer (fast/write_*.wgsl) shares ----------
// (included after common/quant.wgsl: div_rn_bits / div_fast, order keys, f32_to_fp8; docs/kernels.md, "Fast writers".)
// The per-row scales divide by div_fast (div_rn_bits' bits without its 25-step loop, common/quant.wgsl); the rare
// per-element exact path keeps div_rn, in a loop after the writer's main loop (inlined 4 x NV times, div_fast made
// lavapipe's LLVM compile for over 10 minutes).
//
// Lanes: a row (one token of one KV head, K and V together) is served by L = {{LANES}} consecutive
// invocations of a 64-invocation workgroup, R = 64 / L rows a workgroup. The grid is 2-D: workgroup
// (x, y) is number y * gx + x (gx <= 65535), so any number of rows fits one dispatch.
// Reductions over a lane group (amax, min / max of a group) are min reductions of u32 keys (a max is the
// min of the complements), done by `red_min` (4 values) / `red_min2` (2 values) from {{REDUCE_KIND}}:
// subgroupShuffleXor within the aligned lane group (L never exceeds the adapter's smallest subgroup size,
// so a lane group lies inside one subgroup), or workgroup memory on an adapter without subgroups.
//
// Exactness: a code is a step function f of the correctly rounded quotient x / s (int8, int4, KIVI:
// round half to even; FP8: the saturating RNE encoder). The writers take q = x * inv (inv = 1/s on the
// hardware, a few ulp off), evaluate f at |q| - 16 ulp and |q| + 16 ulp and, when both give the same code
// (f is monotone), that is the code of the exact quotient; otherwise (an x / s within 16 ulp of a rounding
// boundary: exact ties included) or for a subnormal x (which a GPU may flush), the exact integer division
// div_rn decides. So the codes are bit-identical to the first-wave writers and the numpy oracles.
const WG: u32 = 64u;
const L: u32 = {{LANES}}u;
const R: u32 = WG / L;
const NEAR: u32 = 16u;

{{REDUCE}}

// 1 / s as the hardware divides it (Vulkan: within 2.5 ulp). INV_ULPS = {{INV_ULPS}} moves it that many ulp
// (0 in the product): the tests emulate an inexact divider on a device that divides exactly.
fn approx_inv(s: f32) -> f32 { return bitcast<f32>(u32(i32(bitcast<u32>(1.0 / s)) + ({{INV_ULPS}}))); }

fn near_lo(m: vec4<u32>) -> vec4<u32> { return max(m, vec4<u32>(NEAR)) - vec4<u32>(NEAR); }
fn near_hi(m: vec4<u32>) -> vec4<u32> { return min(m + vec4<u32>(NEAR), vec4<u32>(0x7F7FFFFFu)); }

fn any_subnormal(x: vec4<f32>) -> bool {
  let b = bitcast<vec4<u32>>(x) & vec4<u32>(ABS_MASK);
  return any((b != vec4<u32>(0u)) & (b < vec4<u32>(F32_MIN_NORMAL_BITS)));
}

// The fast path of round(div_rn(a, b)) (half to even) for 4 values, branch-free: q = round(a * inv) with a's
// sign (inv ~ 1 / b), and whether that is the exact code for all 4 (sure: a * inv is not within NEAR ulp of a
// rounding boundary, and no a is subnormal, which a GPU may flush). Writers keep their codes of the sure ones
// and redo the rest after their main loop, so the exact division is not inlined into every unrolled step.
struct Round4 { q: vec4<f32>, sure: bool }
fn round_mul4(a: vec4<f32>, inv: f32) -> Round4 {
  let m = bitcast<vec4<u32>>(a * inv) & vec4<u32>(ABS_MASK);
  let lo = round(bitcast<vec4<f32>>(near_lo(m)));
  let hi = round(bitcast<vec4<f32>>(near_hi(m)));
  return Round4(select(lo, -lo, a < vec4<f32>(0.0)), all(lo == hi) && !any_subnormal(a));
}

// round(div_rn(a, b)) (half to even) for 4 values, exactly: round_mul4 where it is sure, else div_rn an
// element at a time (a loop: one copy of the division).
fn round_div4(a: vec4<f32>, b: f32, inv: f32) -> vec4<f32> {
  let r = round_mul4(a, inv);
  if (r.sure) { return r.q; }
  var q: vec4<f32>;
  for (var l = 0u; l < 4u; l = l + 1u) { q[l] = round(div_rn(a[l], b)); }
  return q;
}

// asym_scale (common/quant.wgsl) through div_fast: the same bits.
fn asym_scale_fast(mn: f32, mx: f32, levels: u32) -> f32 {
  let range = mx - mn;
  if (!(range >= bitcast<f32>(MIN_RANGE_BITS))) { return 0.0; }
  return div_fast(range, f32(levels));
}

// The writers' fast path where the quotient is known to be small, |Q| < 2^k (int8_token: |x / scale| <= 127 (1 +
// 2^-23), k = 7; asymmetric codes: (x - mn) / scale in [0, levels + 1) = [0, 2^k)): t = q + 3 x 2^k lies in
// [2^(k+1), 2^(k+2)), so its low 23 bits are q + 2^k in units of 2^-F, F = 22 - k, and integer ops on them give
// q's nearest integer (half up; ties are never sure) and how far q is from a halfway point. No round and no
// float-to-int instruction (each 16 a clock an SM on NVIDIA against 128 adds: the writers were bound by them, not
// by bytes), and no float identity a compiler may fold (a (q + c) - c form gave a wrong code at a tie on lavapipe:
// Mesa's NIR may rewrite float ops not marked exact, (q + c) - c as q).
// Sure when q's fraction lies more than 8 units from one half: q = a * inv is within 6 x 2^(k-23) of the exact
// quotient Q (1/scale within 2.5 ulp on Vulkan, 3 more in the tests' inexact divider, the product's rounding; a
// driver contracting into an FMA only moves q closer), 3 units; t rounds q by half a unit; a subnormal operand
// flushed to 0 moves Q by at most 2^-126 / scale (asymmetric: <= levels x 2^-26, scale >= 2^-100 / levels by
// common.wgsl's degenerate range; int8_token: scale >= 1e-8): under 4 units in all, so Q and q round to the same
// integer and Q is no tie. A q outside (-2^k, 2^k) (NaN from an overflowing range) is never sure.
struct Fix4 { n: vec4<i32>, sure: bool }
fn round_fixed4(q: vec4<f32>, k: u32) -> Fix4 {
  let f = 22u - k;
  let half = 1u << (f - 1u);
  let u = bitcast<vec4<u32>>(q + vec4<f32>(f32(3u << k))) - vec4<u32>((k + 128u) << 23u);   // less 2^(k+1)'s bits
  let n = bitcast<vec4<i32>>((u + vec4<u32>(half)) >> vec4<u32>(f)) - vec4<i32>(i32(1u << k));
  let off = abs(bitcast<vec4<i32>>(u & vec4<u32>((1u << f) - 1u)) - vec4<i32>(i32(half)));
  return Fix4(n, all(off > vec4<i32>(8)) && all(u < vec4<u32>(1u << 23u)));
}

// Asymmetric codes (levels = 2^k - 1) by round_fixed4's rule, with q >= 0 known: t = q + 2^(k+1) (the same exponent
// and units), so the integer comes out without the offset and only the top needs a clamp: two integer ops fewer an
// element (on the H200 this form measured faster than round_fixed4 itself for KIVI 2-bit and int4). inv must be 0 where scale is 0 (every code 0, sure).
struct Codes4 { c: vec4<u32>, sure: bool }
fn asym_codes4v_fast(x: vec4<f32>, mn: vec4<f32>, inv: vec4<f32>, levels: u32) -> Codes4 {
  let k = firstLeadingBit(levels) + 1u;
  let base = (k + 128u) << 23u;                         // the bits of 2^(k+1)
  let f = 22u - k;
  let half = 1u << (f - 1u);
  let b = bitcast<vec4<u32>>((x - mn) * inv + vec4<f32>(bitcast<f32>(base)));
  let c = min((b - vec4<u32>(base - half)) >> vec4<u32>(f), vec4<u32>(levels));
  let off = abs(bitcast<vec4<i32>>(b & vec4<u32>((1u << f) - 1u)) - vec4<i32>(i32(half)));
  return Codes4(c, all(off > vec4<i32>(8)) && all(b - vec4<u32>(base) < vec4<u32>(1u << 23u)));
}

// Asymmetric codes clamp(round((x - mn) / scale), 0, levels) of 4 values (scale 0: all 0), as
// common.wgsl asym_code does them one by one: asym_codes4 exactly, asym_codes4_fast the branch-free fast
// path and whether it is exact for all 4.
// (scale stays in the signature, which user kernels copied from the int4 and KIVI templates call; the fast path
// reads only inv, 0 where scale is 0.)
fn asym_codes4_fast(x: vec4<f32>, mn: f32, scale: f32, inv: f32, levels: u32) -> Codes4 {
  return asym_codes4v_fast(x, vec4<f32>(mn), vec4<f32>(inv), levels);
}
fn asym_codes4(x: vec4<f32>, mn: f32, scale: f32, inv: f32, levels: u32) -> vec4<u32> {
  if (scale == 0.0) { return vec4<u32>(0u); }
  let q = round_div4(x - vec4<f32>(mn), scale, inv);
  return vec4<u32>(clamp(q, vec4<f32>(0.0), vec4<f32>(f32(levels))));
}

// 4 codes of `bits` bits (c.x lowest) as the i-th group of 4 in a code word (int4's two, KIVI's 2 or 4 a word).
fn pack_codes4(c: vec4<u32>, bits: u32, i: u32) -> u32 {
  return (c.x | (c.y << bits) | (c.z << (2u * bits)) | (c.w << (3u * bits))) << (4u * bits * i);
}

// Order keys of 4 floats reduced to (min key, ~max key).
fn minmax_keys4(x: vec4<f32>) -> vec2<u32> {
  let u = bitcast<vec4<u32>>(x);
  let k = select(u | vec4<u32>(SIGN_BIT), ~u, (u & vec4<u32>(SIGN_BIT)) != vec4<u32>(0u));
  return vec2<u32>(min(min(k.x, k.y), min(k.z, k.w)), ~max(max(k.x, k.y), max(k.z, k.w)));
}

// ~max |x| bits of 4 floats (a min-reduction key of the amax).
fn amax_key4(x: vec4<f32>) -> u32 {
  let a = bitcast<vec4<u32>>(x) & vec4<u32>(ABS_MASK);
  return ~max(max(a.x, a.y), max(a.z, a.w));
}
// ---- end of write_common.wgsl ---------------------------------------------------------------------
