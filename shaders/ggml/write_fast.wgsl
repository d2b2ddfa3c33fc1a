// #include "ggml/common.wgsl"
// Fast llama.cpp block-type writer, type {{TYPE}} (0 q8_0, 1 q4_0, 2 q4_1, 3 q5_0, 4 q5_1, 5 iq4_nl, 6 mxfp4):
// the record of ggml/write.wgsl (the token's ggml row, {{BPB}} bytes a 32-element block, padded to whole
// u32 words), the same bytes (kvviz/families/ggml/oracle.py): the same per-block arithmetic, element for element:
// correctly rounded divisions (div_fast: div_rn's bits by a float estimate corrected on the integer
// remainder, ~25 operations, not a 25-step loop) for d and id, codes from products x * id passed through
// opq() (xor with the immediate `zero`, 0 at run time) so that no driver fuses them into the add that
// follows, f16 by integer round to nearest even, the first element of largest |x| as the block's `max`,
// blocks with max |x| < 2^-100 at id = 0, iq4_nl's 16 scale trials in llama.cpp's order, its nearest values
// from a workgroup table (below: best_index_int8's codes, one load, not a 16-value search); q8_0's roundf
// as trunc(q + copysign(0.5 - 2^-25, q)) (Q8_TRUNC below; or on the bits of q + 1.5 * 2^23), mxfp4's exponent by a formula
// (mxfp4_e, no 256-entry private table) and its codes as the nearest value on the bits (mxfp4_codes, not
// a 16-value search).
//
// Lanes: a lane owns NB = {{NB}} consecutive blocks of a (token, KV head) row, K and V one after the other;
// NB * BPB is a multiple of 4 bytes (or the lane ends the row), so a lane's bytes are whole u32 words of
// the record and it stores them itself: no lane talks to another (no reduction crosses lanes: a block's
// max, min and scale trials lie in one lane). L = {{LANES}} lanes a row (ceil(blocks / NB) rounded up to a
// power of two; lanes past the row's blocks idle), R = 64 / L rows a workgroup. Lane l loads the 8 vec4s
// of each of its blocks (16-B loads; the next block's are issued before it quantises one), builds its words
// in registers (constant byte offsets: the loops are unrolled) and stores them. Grid 2-D: workgroup (x, y)
// is number y * gx + x. PAD_SLOT rows are skipped.
// iq4_nl only: the workgroup first fills its nearest-value table (IQ4_TV / IQ4_TC), one barrier, then as above.
@group(0) @binding(0) var<storage, read> key_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> val_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<u32>;
struct P { kvh: u32, hd: u32, bs: u32, wpt: u32, rows: u32, gx: u32, zero: u32 }
var<immediate> p: P;

const TYPE: u32 = {{TYPE}}u;
const BPB: u32 = {{BPB}}u;   // bytes per block
const HDR: u32 = {{HDR}}u;   // header bytes (d | d, m | e)
const QH: u32 = {{QH}}u;     // 1: a 4-byte high-bit plane follows the header
const NQ: u32 = {{NQ}}u;     // qs words a block: 8 (q8_0) or 4
const NB: u32 = {{NB}}u;     // blocks a lane
const L: u32 = {{LANES}}u;
const R: u32 = 64u / L;
const NWL: u32 = {{NWL}}u;   // words a lane: ceil(NB * BPB / 4)
const NW1: u32 = {{NW1}}u;   // min(NWL, 16)
const NW2: u32 = {{NW2}}u;   // NWL - NW1
const TINY_BITS: u32 = 0x0D800000u;      // 2^-100
const IQ4_EPS_BITS: u32 = 0x26901D7Du;   // GROUP_MAX_EPS = 1e-15f

// Q8_TRUNC (the default; kvviz/families/ggml/writer.py has its timing): q8_0's roundf as
// trunc(q + copysign(0.5 - 2^-25, q)), 6 operations and a conversion an element against the bit-level RNE with a
// tie fix (18). Exact for every |q| < 256 (checked over every float32 there against round half away
// from zero; |q| <= 127 (1 + 2^-22) here): a tie k + 1/2 reaches k + 1 - 2^-25, which rounds to k + 1, and
// anything below it stays below k + 1. opq4: the product is not fused into the add.
const Q8_TRUNC: bool = {{Q8_TRUNC}};

fn opq(x: f32) -> f32 { return bitcast<f32>(bitcast<u32>(x) ^ p.zero); }
fn opq4(x: vec4<f32>) -> vec4<f32> { return bitcast<vec4<f32>>(bitcast<vec4<u32>>(x) ^ vec4<u32>(p.zero)); }

// kvalues_iq4nl as a const array: indexed by constants only (unrolled loops).
const IQ4V = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
                            1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);
// iq4_nl's nearest value by table. best_index_int8(16, kvalues_iq4nl, a) (the nearer neighbour, the upper
// one on a tie: `a - v[l] < v[l + 1] - a ? l : l + 1`, 0 at a <= -127, 15 at a >= 113) is the number of
// midpoints m_i = (v[i] + v[i + 1]) / 2 with a >= m_i: near a midpoint both differences are exact
// (Sterbenz-like: |m_i| is at least half the gap there), so the rounded comparison is the exact one
// (checked over every float32 in [-300, 300]). The midpoints are half-integers, so a >= m_i iff
// floor(2a) >= 2 m_i: entry n = floor(2a) + IQ4_OFF of IQ4_TC holds that count and of IQ4_TV its value.
// The scale trials' |a| = |id x| <= 134 (1 + 2^-22) (|x| <= |max|, |id| <= 134 / |max| correctly rounded),
// floor(2a) in [-269, 268]: in range unclamped; the final codes clamp (|1/d x| has no such bound).
// Built by the workgroup before anything else (iq4_nl only; the other types get a 1-entry table unused).
const IQ4_TN: u32 = {{IQ4_TN}}u;   // 544 (iq4_nl) or 1
const IQ4_OFF: i32 = 272;
// an integral t in [-272, 271] (a floor(2a)) -> its entry t + IQ4_OFF: t + 1.5 * 2^23 + IQ4_OFF is exact and
// its bits are 0x4B400000 + the entry (no float -> int conversion)
fn iq4_entry(t: vec4<f32>) -> vec4<u32> {
  return bitcast<vec4<u32>>(t + vec4<f32>(12582912.0 + f32(IQ4_OFF))) - vec4<u32>(0x4B400000u);
}
var<workgroup> IQ4_TV: array<f32, IQ4_TN>;
var<workgroup> IQ4_TC: array<u32, IQ4_TN>;

fn iq4_table(lid: u32) {
  for (var k = 0u; k < (IQ4_TN + 63u) / 64u; k = k + 1u) {   // a uniform loop: the barrier follows it
    let n = lid + 64u * k;
    if (n < IQ4_TN) {
      let t = f32(i32(n) - IQ4_OFF);   // floor(2a)
      var c = 0u;
      var v = IQ4V[0];
      // @unroll
      for (var i = 0u; i < 15u; i = i + 1u) {
        let ge = t >= IQ4V[i] + IQ4V[i + 1u];   // 2 m_i, exact
        c = c + select(0u, 1u, ge);
        v = select(v, IQ4V[i + 1u], ge);
      }
      IQ4_TC[n] = c;
      IQ4_TV[n] = v;
    }
  }
}

// best_index_int8 of 4 products a (the final codes): floor(2a) clamped to the table's ends (codes 0 and 15,
// as for every floor(2a) beyond them; +-inf too); NaN gives 1, as the select search it replaces did.
fn iq4_codes(a: vec4<f32>) -> vec4<u32> {
  let n = iq4_entry(clamp(floor(a + a), vec4<f32>(f32(-IQ4_OFF)), vec4<f32>(f32(IQ4_OFF - 1))));
  var c: vec4<u32>;
  // @unroll
  for (var k = 0u; k < 4u; k = k + 1u) { c[k] = IQ4_TC[n[k]]; }
  return select(c, vec4<u32>(1u), (bitcast<vec4<u32>>(a) & vec4<u32>(ABS_MASK)) > vec4<u32>(0x7F800000u));   // NaN
}

// iq4_nl's weighted sums for one trial id (weights x^2), in element order, unfused (ggml_write.wgsl
// iq4_sums): q the value nearest id * x, by table at floor(2 id x) = floor((id + id) * x) (exact doubling; a
// product underflowing to 0 or a subnormal lands at 0 or -1, the same code 8); the two terms added are
// opaque products (no fused multiply-add), the products that only feed products need no such guard.
fn iq4_sums(x: array<vec4<f32>, 8>, id: f32) -> vec2<f32> {
  let id2 = vec4<f32>(id + id);
  var sqx = 0.0;
  var sq2 = 0.0;
  // @unroll
  for (var j = 0u; j < 8u; j = j + 1u) {
    let v = x[j];
    let n = iq4_entry(floor(id2 * v));
    // @unroll
    for (var c = 0u; c < 4u; c = c + 1u) {
      let xe = v[c];
      let q = IQ4_TV[n[c]];
      let wq = (xe * xe) * q;
      sqx = sqx + opq(wq * xe);
      sq2 = sq2 + opq(wq * q);
    }
  }
  return vec2<f32>(sqx, sq2);
}

// div_fast / div_fast_bits: common/quant.wgsl (div_rn_bits without its 25-step loop, the same bits).

fn iq4_trial_id(r: u32, mx: f32) -> f32 {
  if (r == 0u) { return div_fast(1.0, div_fast(-mx, -127.0)); }
  return div_fast(f32(i32(r) - 8 - 127), mx);
}

// mxfp4's e = floor(log2f(amax)) - 2 + 127 for a non-tiny amax (biased exponent be >= 27), log2f correctly
// rounded: be - 127, or be - 126 where amax is within c ulp of the next power of two (its mantissa + c >= 2^23),
// c = floor(2^j ln 2) = 44 >> (6 - j), 2^j <= |log2 amax| < 2^(j + 1) the magnitude of the log just below
// that power (be - 127 >= 1 above 1, 126 - be >= 1 below 1; 0: c = 0): the log rounds up to the next integer
// n where it lies within half an ulp of n. kvviz/families/ggml/format.py log2_up_table holds 2^23 - c, checked there
// against numpy's float32 log2 (tests/test_fast_write_ggml.py: this formula against that table).
fn mxfp4_e(amax_bits: u32) -> u32 {
  let be = amax_bits >> 23u;
  let t = select(126u - be, be - 127u, be >= 127u);
  let c = select(44u >> (6u - firstLeadingBit(t)), 0u, t == 0u);
  return be - 2u + select(0u, 1u, (amax_bits & 0x7FFFFFu) + c >= 0x800000u);
}

// mxfp4 codes of 4 values: gguf's argmin over kv of |d kv - x| (kvalues_mxfp4, the doubled E2M1 values; the
// first index on a tie) is the nearest of 0, d, 2d, 3d, 4d, 6d, 8d, 12d to |x| (the smaller on a tie) with
// x's sign (code + 8; 0 where the nearest is 0: index 0 beats index 8 and every value of the other sign):
// for |x| < 16 d the errors of the two neighbours of |x| are exact (Sterbenz) and any other candidate's
// exceeds them by at least d, so the rounded errors order as the exact ones. On t = |x| / d (exact: id = 1/d
// a power of two; a flushed subnormal gives 0, its code anyway): t < 2: 0, 1, 2 at the midpoints 0.5, 1.5
// (ties down); t >= 2: 1 mantissa bit (steps 1, 2, 4 on [2, 4), [4, 8), [8, 16)), rounded half down on the
// bits: code (bits + 2^21 - 1) >> 22 less 254. mx: the largest code, 7; 5 where e = 253 (amax within 44 ulp
// of 2^128: d = 2^125, 8d and 12d overflow to inf and so do their errors).
fn mxfp4_codes(v: vec4<f32>, id: f32, mx: u32) -> vec4<u32> {
  let t = abs(v) * id;
  let tb = bitcast<vec4<u32>>(t);
  let big = ((tb + vec4<u32>(0x1FFFFFu)) >> vec4<u32>(22u)) - vec4<u32>(254u);   // t >= 2 only
  let small = select(vec4<u32>(0u), vec4<u32>(1u), t > vec4<f32>(0.5)) + select(vec4<u32>(0u), vec4<u32>(1u), t > vec4<f32>(1.5));
  let m = min(select(small, big, tb >= vec4<u32>(0x40000000u)), vec4<u32>(mx));
  return m | select(vec4<u32>(0u), vec4<u32>(8u), (v < vec4<f32>(0.0)) & (m != vec4<u32>(0u)));
}

// A block's bytes: header (HDR bytes, little-endian), the q5 high-bit plane, NQ qs words.
struct Blk { hdr: u32, qh: u32, qs: array<u32, 8> }

fn nibbles(lo: vec4<u32>, hi: vec4<u32>) -> u32 {
  let b = (lo & vec4<u32>(0xFu)) | ((hi & vec4<u32>(0xFu)) << vec4<u32>(4u));
  return b.x | (b.y << 8u) | (b.z << 16u) | (b.w << 24u);
}

fn quant_block(x: array<vec4<f32>, 8>) -> Blk {
  var out: Blk;
  // block statistics: amax (the first element of largest |x| is `mx`), min / max by total order
  var amax_bits = bitcast<u32>(x[0].x) & ABS_MASK;
  var mx = x[0].x;
  var kmin = 0xFFFFFFFFu;
  var kmax = 0u;
  // @unroll
  for (var j = 0u; j < 8u; j = j + 1u) {
    // @unroll
    for (var c = 0u; c < 4u; c = c + 1u) {
      let e = x[j][c];
      let a = bitcast<u32>(e) & ABS_MASK;
      if (TYPE == 1u || TYPE == 3u || TYPE == 5u) {   // the signed max: the first element of largest |x|
        if (a > amax_bits) { amax_bits = a; mx = e; }
      } else {
        amax_bits = max(amax_bits, a);
      }
      if (TYPE == 2u || TYPE == 4u) {
        let k = order_key(bitcast<u32>(e));
        kmin = min(kmin, k);
        kmax = max(kmax, k);
      }
    }
  }
  let tiny = amax_bits < TINY_BITS;
  var id = 0.0;
  var mn = 0.0;
  var mx4 = 7u;
  if (TYPE == 0u || TYPE == 1u || TYPE == 3u) {
    var d: f32;
    if (TYPE == 0u) { d = div_fast(bitcast<f32>(amax_bits), 127.0); }
    else if (TYPE == 1u) { d = div_fast(mx, -8.0); }
    else { d = div_fast(mx, -16.0); }
    out.hdr = f32_to_f16_bits(d);
    if (!tiny) { id = div_fast(1.0, d); }
  } else if (TYPE == 2u || TYPE == 4u) {
    mn = bitcast<f32>(key_bits(kmin));
    let d = div_fast(bitcast<f32>(key_bits(kmax)) - mn, select(31.0, 15.0, TYPE == 2u));
    out.hdr = f32_to_f16_bits(d) | (f32_to_f16_bits(mn) << 16u);
    if (!tiny && (bitcast<u32>(d) & ABS_MASK) != 0u) { id = div_fast(1.0, d); }
  } else if (TYPE == 5u) {
    // llama.cpp quantize_row_iq4_nl_impl (ntry = 7): trial 0 (id = 1/(max/127)), then itry = -7..7, the
    // selection in that order (ggml_write.wgsl runs the trials on 16 threads, the selection the same way)
    var d = 0.0;
    if (amax_bits >= IQ4_EPS_BITS) {
      var best = 0.0;
      for (var r = 0u; r < 16u; r = r + 1u) {   // one copy of the trial's code: trial 0 sets d and best
        let s = iq4_sums(x, iq4_trial_id(r, mx));
        if (r == 0u || (s.y > 0.0 && opq(s.x * s.x) > opq(best * s.y))) {
          d = div_fast(s.x, s.y);
          best = opq(d * s.x);
        }
      }
    }
    out.hdr = f32_to_f16_bits(d);
    id = select(0.0, div_fast(1.0, d), (bitcast<u32>(d) & ABS_MASK) != 0u);
  } else {
    // mxfp4: e = floor(log2f(amax)) - 2 + 127, log2f correctly rounded (mxfp4_e); id holds 1/d = 2^(128 - e)
    // (exact, a normal float for the non-tiny e = 25 .. 253), 0 for a tiny block (codes 0)
    let e = select(mxfp4_e(amax_bits), 0u, tiny);
    out.hdr = e;
    id = select(bitcast<f32>((255u - e) << 23u), 0.0, tiny);
    mx4 = select(7u, 5u, e >= 253u);
  }

  // codes, 4 at a time
  var qh = 0u;
  var c4: array<vec4<u32>, 8>;
  // @unroll
  for (var j = 0u; j < 8u; j = j + 1u) {
    let v = x[j];
    var c: vec4<u32>;
    if (TYPE == 0u && Q8_TRUNC) {   // roundf as trunc(q + copysign(0.5 - 2^-25, q)): see Q8_TRUNC above
      let q = opq4(v * id);
      let hp = bitcast<vec4<f32>>((bitcast<vec4<u32>>(q) & vec4<u32>(SIGN_BIT)) | vec4<u32>(0x3EFFFFFFu));
      c = bitcast<vec4<u32>>(vec4<i32>(trunc(q + hp))) & vec4<u32>(0xFFu);
    } else if (TYPE == 0u) {   // roundf (half away from zero), as gguf's np_roundf: r = rne(q) (|q| <= 128:
      // the bits of q + 1.5 * 2^23 less 0x4B400000), then 1 away from zero where r is a tie rounded toward
      // zero (q - r = 1/2, q > 0 or q - r = -1/2, q < 0; exact); no float -> int conversion, no floor
      // (quarter-rate on a GPU). opq4: the sum is not folded into the subtraction that recovers r.
      let q = opq4(v * id);
      let s = opq4(q + vec4<f32>(12582912.0));
      let h = q - (s - vec4<f32>(12582912.0));
      let z = vec4<f32>(0.0);
      let r = bitcast<vec4<u32>>(s) - vec4<u32>(0x4B400000u)
              + select(vec4<u32>(0u), vec4<u32>(1u), (h == vec4<f32>(0.5)) & (q > z))
              - select(vec4<u32>(0u), vec4<u32>(1u), (h == vec4<f32>(-0.5)) & (q < z));
      c = r & vec4<u32>(0xFFu);
    } else if (TYPE == 1u) {
      c = min(vec4<u32>(15u), vec4<u32>(trunc(opq4(v * id) + vec4<f32>(8.5))));
    } else if (TYPE == 3u) {
      c = min(vec4<u32>(31u), vec4<u32>(trunc(opq4(v * id) + vec4<f32>(16.5))));
    } else if (TYPE == 2u || TYPE == 4u) {
      c = min(vec4<u32>(select(31u, 15u, TYPE == 2u)), vec4<u32>(trunc(opq4((v - vec4<f32>(mn)) * id) + vec4<f32>(0.5))));
    } else if (TYPE == 5u) {
      c = iq4_codes(opq4(vec4<f32>(id) * v));
    } else {                   // mxfp4: argmin |d*kv - x|, the first on a tie: mxfp4_codes
      c = mxfp4_codes(v, id, mx4);
    }
    c4[j] = c;
    if (QH == 1u) {
      let hb = (c >> vec4<u32>(4u)) & vec4<u32>(1u);
      qh = qh | ((hb.x | (hb.y << 1u) | (hb.z << 2u) | (hb.w << 3u)) << (4u * j));
    }
  }
  out.qh = qh;
  if (TYPE == 0u) {
    // @unroll
    for (var j = 0u; j < 8u; j = j + 1u) {
      let c = c4[j];
      out.qs[j] = c.x | (c.y << 8u) | (c.z << 16u) | (c.w << 24u);
    }
  } else {                     // qs byte i: element i low nibble, element i + 16 high nibble
    // @unroll
    for (var j = 0u; j < 4u; j = j + 1u) { out.qs[j] = nibbles(c4[j], c4[j + 4u]); }
  }
  return out;
}

// OR `w` into the lane's words at byte offset `o` (a constant once the loops are unrolled).
fn put(ob: ptr<function, array<u32, NWL>>, o: u32, w: u32) {
  let a = o / 4u;
  let s = (o % 4u) * 8u;
  (*ob)[a] = (*ob)[a] | (w << s);
  if (s != 0u) {
    let b = min(a + 1u, NWL - 1u);
    (*ob)[b] = (*ob)[b] | (w >> (32u - s));
  }
}

// The 8 vec4s of the block at vec4 `at` of K (which = 0) or V (zeros where `ok` is false: past the row's blocks).
fn load_block(which: u32, at: u32, ok: bool) -> array<vec4<f32>, 8> {
  var x: array<vec4<f32>, 8>;
  if (ok) {
    // @unroll
    for (var j = 0u; j < 8u; j = j + 1u) {
      if (which == 0u) { x[j] = key_in[at + j]; } else { x[j] = val_in[at + j]; }
    }
  }
  return x;
}

// The block after block k of K (which = 0) or V: block k + 1, or V's first after K's last (zeros after V's last).
fn next_block(which: u32, k: u32, src: u32, b0: u32, nb: u32, ok: bool) -> array<vec4<f32>, 8> {
  if (k + 1u < NB) { return load_block(which, src + 8u * (k + 1u), ok && b0 + k + 1u < nb); }
  return load_block(1u, src, ok && which == 0u);
}

// Measured on the H200 at the anchor: faster for q8_0, q4_0, q5_0 and mxfp4, slower for iq4_nl (its 16 trials want
// the registers), so not iq4_nl: it loads the next block after quantising one (figures in docs/benchmarks.md).
const PIPELINE: bool = TYPE != 5u;

// XCH = 1 (where the adapter's smallest subgroup holds a unit of UNIT lanes): a lane a block (NB = 1). A block
// that ends inside a word shares that word with the next block's lane: the lane builds its block's bytes
// shifted to their place in the word stream (sh = (b * BPB) % 4 bytes), takes the next lane's first word by
// subgroupShuffleDown and ORs it in; that lane does not store it. A unit's blocks end word-aligned, so the
// partner lies in the same aligned unit, inside one subgroup. XCH = 0: NB blocks a lane, no exchange.
const XCH: u32 = {{XCH}}u;
// the next lane's first word (XCH = 1: subgroupShuffleDown; 0: unused, no subgroup op in the shader)
fn next_first(v: u32) -> u32 { {{NEXT_FIRST}} }

// STAGE = 1: the lanes put their words into workgroup memory at their row's place (SO), with each row's
// record start (SD), and after a barrier the 64 threads store the workgroup's R records word by word, thread j
// words j, j + 64, ...: consecutive threads, consecutive words of a record. Without it a store instruction
// writes 4-byte words a lane's bytes apart (BPB with a lane a block), touching a sector for every lane. On the
// H200 at the anchor staging is faster for every type, a lane a block or a lane its whole words, but iq4_nl (its
// table shares the workgroup memory), so not iq4_nl (figures in docs/benchmarks.md).
const STAGE: u32 = {{STAGE}}u;
const WPR: u32 = {{WPR}}u;                 // words of a row's record (the type's words per token)
const NO_ROW: u32 = 0xFFFFFFFFu;
const STORES: u32 = (R * WPR + 63u) / 64u;   // the staged stores a thread makes (STAGE)
var<workgroup> SO: array<u32, {{SO_LEN}}>;   // R * WPR (STAGE) or 1
var<workgroup> SD: array<u32, {{SD_LEN}}>;   // R (STAGE) or 1

// Word `w` of K (which = 0) or V at index i: of SO (STAGE) or of the cache.
fn emit(which: u32, i: u32, w: u32) {
  if (STAGE == 1u) { SO[i] = w; } else if (which == 0u) { k_cache[i] = w; } else { v_cache[i] = w; }
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  if (TYPE == 5u) {   // iq4_nl's table, before any lane returns
    iq4_table(lid);
    workgroupBarrier();
  }
  let row = (wg.y * p.gx + wg.x) * R + lid / L;
  let lane = lid % L;
  let nb = p.hd / 32u;
  let b0 = lane * NB;
  let ok = row < p.rows && b0 < nb;   // a lane with blocks to quantise (XCH: idle ones still shuffle)
  if (XCH == 0u && STAGE == 0u && !ok) { return; }   // (STAGE: every thread reaches the barriers)
  let t = select(0u, row / p.kvh, ok);
  let h = row % p.kvh;
  let slot = slots[t];
  let store = ok && slot != PAD_SLOT;
  if (XCH == 0u && STAGE == 0u && !store) { return; }
  let w0 = (b0 * BPB) / 4u;
  let dst = ((slot / p.bs) * p.kvh + h) * p.bs * p.wpt + (slot % p.bs) * p.wpt + w0;
  let nw = min(NWL, p.wpt - min(p.wpt, w0));
  let src = row * (p.hd / 4u) + 8u * b0;
  let sh = 8u * ((b0 * BPB) % 4u);                          // XCH: the block's first byte in its first word, in bits
  let cnt = (sh / 8u + BPB + 3u) / 4u;                      // XCH: words the block touches
  let give = XCH == 1u && sh != 0u;                         // XCH: the first word is the previous lane's to store
  let take = XCH == 1u && ((b0 + 1u) * BPB) % 4u != 0u && b0 + 1u < nb;   // XCH: the last word is shared
  // Software-pipelined loads (PIPELINE): the next block's 8 vec4s (K's blocks, then V's) are loaded before this
  // one is quantised, so a lane has two blocks' loads in flight instead of one.
  var x = load_block(0u, src, ok);
  for (var which = 0u; which < 2u; which = which + 1u) {   // K, then V (not unrolled: one copy of the code)
    var ob: array<u32, NWL>;
    ob = array<u32, NWL>();   // zeroed each pass (naga hoists loop locals: the declaration zeroes once)
    // @unroll
    for (var k = 0u; k < NB; k = k + 1u) {
      var nxt: array<vec4<f32>, 8>;
      if (PIPELINE) { nxt = next_block(which, k, src, b0, nb, ok); }
      if (ok && b0 + k < nb) {
        let blk = quant_block(x);
        let o = k * BPB;
        put(&ob, o, blk.hdr);
        if (QH == 1u) { put(&ob, o + HDR, blk.qh); }
        // @unroll
        for (var i = 0u; i < NQ; i = i + 1u) { put(&ob, o + HDR + 4u * QH + 4u * i, blk.qs[i]); }
      }
      if (!PIPELINE) { nxt = next_block(which, k, src, b0, nb, ok); }
      x = nxt;
    }
    if (XCH == 1u) {
      // shift the block's bytes to byte sh / 8 of its first word (ob's last word is spare: the carry lands there)
      if (sh != 0u) {
        // @unroll
        for (var j = 0u; j < NWL; j = j + 1u) {
          let i = NWL - 1u - j;
          var w = ob[i] << sh;
          if (i > 0u) { w = w | (ob[max(i, 1u) - 1u] >> (32u - sh)); }   // max: naga checks ob[i - 1] at i = 0 too
          ob[i] = w;
        }
      }
      let nf = next_first(ob[0]);   // the next lane's first word
      // @unroll
      for (var i = 0u; i < NWL; i = i + 1u) {
        if (take && i + 1u == cnt) { ob[i] = ob[i] | nf; }
      }
    }
    let rl = lid / L;
    let at = select(dst, rl * WPR + w0, STAGE == 1u);   // the lane's first word: in SO (STAGE) or in the cache
    if (store) {
      // the lane's words in two unrolled runs of at most 16 (kvviz/gpu/shaders.UNROLL_MAX: a longer marked loop
      // stays a loop, and ob indexed by its variable would leave registers)
      // @unroll
      for (var w = 0u; w < NW1; w = w + 1u) {
        if (w < nw && (XCH == 0u || (w < cnt && !(give && w == 0u)))) { emit(which, at + w, ob[w]); }
      }
      // @unroll
      for (var i = 0u; i < NW2; i = i + 1u) {
        if (NW1 + i < nw) { emit(which, at + NW1 + i, ob[NW1 + i]); }
      }
    }
    if (STAGE == 1u) {   // the workgroup's records from SO, word by word
      if (lane == 0u) { SD[rl] = select(NO_ROW, dst - w0, store); }
      workgroupBarrier();
      // @unroll (straight-line: naga bounds a loop, so a loop stays a loop)
      for (var j = 0u; j < STORES; j = j + 1u) {
        let n = lid + 64u * j;
        let d = SD[min(n / WPR, R - 1u)];
        if (n < R * WPR && d != NO_ROW) {
          if (which == 0u) { k_cache[d + n % WPR] = SO[n]; } else { v_cache[d + n % WPR] = SO[n]; }
        }
      }
      workgroupBarrier();
    }
  }
}
