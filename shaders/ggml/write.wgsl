// #include "ggml/common.wgsl"
// llama.cpp block-type writer, type {{TYPE}} (0 q8_0, 1 q4_0, 2 q4_1, 3 q5_0, 4 q5_1, 5 iq4_nl, 6 mxfp4):
// blocks of 32 consecutive elements of a token's head vector, {{BPB}} bytes each, laid out as ggml lays
// them out (kvviz/families/ggml/format.py); the token's record is its ggml row padded to whole u32 words.
// Bit-identical to gguf.quants.quantize (iq4_nl: to llama.cpp's reference, kvviz/families/ggml/oracle.py):
//   * divisions are correctly rounded (div_rn) and, as in ggml, codes come from x * id with id = 1/d;
//   * no product is fused into the add that follows it: products pass through opq() (an xor with the
//     immediate `zero`, 0 at run time, which a driver cannot see through), so ties such as
//     trunc(x*id + 8.5) and roundf(x*id) break exactly as in numpy / C;
//   * scales become f16 by integer round-to-nearest-even (f32_to_f16_bits); a scale of 65520 or more
//     gives inf, which the host refuses before dispatch (iq4_nl: by a bound on max |x|, and after);
//   * the first element of largest |x| is the block's `max` (numpy argmax); min / max by total order;
//   * blocks with max |x| < 2^-100 take id = 0 (kvviz/families/ggml/oracle.py says why).
// One 64-thread workgroup per (token row, kv head, K|V): grid (rows, kv_heads, 2). Block parameters:
// one thread per block (iq4_nl: its 16 scale trials one thread each, then the selection one thread per
// block); codes: one thread per element; words: one thread per word.
@group(0) @binding(0) var<storage, read> key_in: array<f32>;
@group(0) @binding(1) var<storage, read> val_in: array<f32>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<u32>;
struct P { kvh: u32, hd: u32, bs: u32, wpt: u32, zero: u32 }
var<immediate> p: P;

const TYPE: u32 = {{TYPE}}u;
const BPB: u32 = {{BPB}}u;   // bytes per block
const HDR: u32 = {{HDR}}u;   // header bytes (d | d, m | e)
const QH: u32 = {{QH}}u;     // 1: a 4-byte high-bit plane follows the header
const TINY_BITS: u32 = 0x0D800000u;  // 2^-100

var<workgroup> s_hdr: array<u32, 8>;    // header bytes of each block (little-endian)
var<workgroup> s_id: array<f32, 8>;     // id (mxfp4: the scale 2^(e-128))
var<workgroup> s_min: array<f32, 8>;    // q4_1 / q5_1: block minimum
var<workgroup> s_code: array<u32, 256>;
var<workgroup> s_amax: array<u32, 8>;       // iq4_nl: |max| bits and max of each block
var<workgroup> s_mx: array<f32, 8>;
var<workgroup> s_sums: array<vec2<f32>, 128>;  // iq4_nl: (sumqx, sumq2) of trial r of block b at 16b + r
const IQ4_EPS_BITS: u32 = 0x26901D7Du;  // GROUP_MAX_EPS = 1e-15f

fn load_x(which: u32, i: u32) -> f32 { if (which == 0u) { return key_in[i]; } return val_in[i]; }
fn store_w(which: u32, i: u32, w: u32) { if (which == 0u) { k_cache[i] = w; } else { v_cache[i] = w; } }
fn opq(x: f32) -> f32 { return bitcast<f32>(bitcast<u32>(x) ^ p.zero); }

// best_index_int8(16, kvalues_iq4nl, x): the nearer neighbour, the upper one on a tie. The C binary search
// ends at ml = the largest index with values[ml] <= x (values strictly increasing), mu = ml + 1: counted here
// without branches (lavapipe runs a workgroup's threads in SIMD lanes). NaN (never produced: every id is
// finite) would give 15 in C and 1 here.
fn best_index(x: f32) -> u32 {
  if (x <= -127.0) { return 0u; }
  if (x >= 113.0) { return 15u; }
  var ml = 0u;
  for (var i = 1u; i < 15u; i = i + 1u) { ml = ml + select(0u, 1u, iq4nl_value(i) <= x); }
  let mu = ml + 1u;
  return select(mu, ml, x - iq4nl_value(ml) < iq4nl_value(mu) - x);
}

// iq4_nl's weighted sums for one trial id (weights x^2), in element order, unfused.
fn iq4_sums(which: u32, base: u32, id: f32) -> vec2<f32> {
  var sqx = 0.0;
  var sq2 = 0.0;
  for (var j = 0u; j < 32u; j = j + 1u) {
    let x = load_x(which, base + j);
    let q = iq4nl_value(best_index(opq(id * x)));
    let w = opq(x * x);
    let wq = opq(w * q);
    sqx = sqx + opq(wq * x);
    sq2 = sq2 + opq(wq * q);
  }
  return vec2<f32>(sqx, sq2);
}

// iq4_nl trial r of a block (llama.cpp quantize_row_iq4_nl_impl, ntry = 7): r = 0 the first pass with
// id = 1/(max/127), r = 1..15 the tries itry = r - 8 with id = (itry - 127)/max. Each trial's sums are
// independent, so the 16 trials run on 16 threads; the selection then runs in llama.cpp's order.
fn iq4_trial_id(r: u32, mx: f32) -> f32 {
  if (r == 0u) { return div_rn(1.0, div_rn(-mx, -127.0)); }
  return div_rn(f32(i32(r) - 8 - 127), mx);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let t = wg.x;
  let h = wg.y;
  let which = wg.z;
  let tid = lid.x;
  let src = (t * p.kvh + h) * p.hd;
  let nb = p.hd / 32u;
  let slot = slots[t];
  let real = slot != PAD_SLOT;

  // ---- block parameters (one thread a block)
  if (tid < nb) {
    let base = src + 32u * tid;
    var amax_bits = bitcast<u32>(load_x(which, base)) & ABS_MASK;
    var mx = load_x(which, base);
    var kmin = 0xFFFFFFFFu;
    var kmax = 0u;
    for (var j = 0u; j < 32u; j = j + 1u) {
      let x = load_x(which, base + j);
      let a = bitcast<u32>(x) & ABS_MASK;
      if (a > amax_bits) { amax_bits = a; mx = x; }
      let k = order_key(bitcast<u32>(x));
      kmin = min(kmin, k);
      kmax = max(kmax, k);
    }
    let tiny = amax_bits < TINY_BITS;
    var id = 0.0;
    var hdr = 0u;
    if (TYPE == 0u || TYPE == 1u || TYPE == 3u) {
      var d: f32;
      if (TYPE == 0u) { d = div_rn(bitcast<f32>(amax_bits), 127.0); }
      else if (TYPE == 1u) { d = div_rn(mx, -8.0); }
      else { d = div_rn(mx, -16.0); }
      hdr = f32_to_f16_bits(d);
      if (!tiny) { id = div_rn(1.0, d); }
    } else if (TYPE == 2u || TYPE == 4u) {
      let mn = bitcast<f32>(key_bits(kmin));
      let d = div_rn(bitcast<f32>(key_bits(kmax)) - mn, select(31.0, 15.0, TYPE == 2u));
      hdr = f32_to_f16_bits(d) | (f32_to_f16_bits(mn) << 16u);
      if (!tiny && (bitcast<u32>(d) & ABS_MASK) != 0u) { id = div_rn(1.0, d); }
      s_min[tid] = mn;
    } else if (TYPE == 5u) {
      s_amax[tid] = amax_bits;   // the search runs below, over all threads
      s_mx[tid] = mx;
    } else {
      // mxfp4: e = floor(log2f(amax)) - 2 + 127, log2f correctly rounded (kvviz/families/ggml/format.py LOG2_UP)
      var up = array<u32, 256>({{LOG2_UP}});
      var e = 0u;
      if (!tiny) {
        let be = amax_bits >> 23u;
        e = be - 2u + select(0u, 1u, (amax_bits & 0x7FFFFFu) >= up[be]);
      }
      hdr = e;
      id = bitcast<f32>(e8m0_half_bits(e));
      if (tiny) { id = 0.0; }
    }
    s_hdr[tid] = hdr;
    s_id[tid] = id;
  }
  workgroupBarrier();

  // ---- iq4_nl: the 16 trials of every block in parallel, then the selection in order (one thread a block)
  if (TYPE == 5u) {
    for (var task = tid; task < 16u * nb; task = task + 64u) {
      let b = task / 16u;
      if (s_amax[b] >= IQ4_EPS_BITS) {
        s_sums[task] = iq4_sums(which, src + 32u * b, iq4_trial_id(task % 16u, s_mx[b]));
      }
    }
    workgroupBarrier();
    if (tid < nb) {
      var d = 0.0;
      if (s_amax[tid] >= IQ4_EPS_BITS) {
        var s = s_sums[16u * tid];
        d = div_rn(s.x, s.y);
        var best = opq(d * s.x);
        for (var r = 1u; r < 16u; r = r + 1u) {
          s = s_sums[16u * tid + r];
          if (s.y > 0.0 && opq(s.x * s.x) > opq(best * s.y)) {
            d = div_rn(s.x, s.y);
            best = opq(d * s.x);
          }
        }
      }
      s_hdr[tid] = f32_to_f16_bits(d);
      s_id[tid] = select(0.0, div_rn(1.0, d), (bitcast<u32>(d) & ABS_MASK) != 0u);
    }
    workgroupBarrier();
  }

  // ---- codes (one thread an element)
  for (var i = tid; i < p.hd; i = i + 64u) {
    let b = i / 32u;
    let x = load_x(which, src + i);
    let id = s_id[b];
    var c = 0u;
    if (TYPE == 0u) {          // roundf (half away from zero), as gguf's np_roundf
      let v = opq(x * id);
      let a = abs(v);
      let f = floor(a);
      let r = f + floor(2.0 * (a - f));
      c = u32(select(i32(r), -i32(r), v < 0.0)) & 0xFFu;
    } else if (TYPE == 1u) {
      c = min(15u, u32(trunc(opq(x * id) + 8.5)));
    } else if (TYPE == 3u) {
      c = min(31u, u32(trunc(opq(x * id) + 16.5)));
    } else if (TYPE == 2u || TYPE == 4u) {
      c = min(select(31u, 15u, TYPE == 2u), u32(trunc(opq((x - s_min[b]) * id) + 0.5)));
    } else if (TYPE == 5u) {
      c = best_index(opq(id * x));
    } else {                   // mxfp4: argmin |d*kv - x|, the first on a tie (id holds d)
      var best = 0.0;
      for (var k = 0u; k < 16u; k = k + 1u) {
        let err = abs(opq(id * e2m1_doubled(k)) - x);   // d*kv: exact, or inf as in gguf (not fused away)
        if (k == 0u || err < best) { best = err; c = k; }
      }
    }
    s_code[i] = c;
  }
  workgroupBarrier();
  if (!real) { return; }

  // ---- words of the record (one thread a word): byte 4w+l of the ggml row in byte l of word w
  let dst = ((slot / p.bs) * p.kvh + h) * p.bs * p.wpt + (slot % p.bs) * p.wpt;
  let row_bytes = nb * BPB;
  for (var w = tid; w < p.wpt; w = w + 64u) {
    var word = 0u;
    for (var l = 0u; l < 4u; l = l + 1u) {
      let gb = 4u * w + l;
      if (gb >= row_bytes) { break; }
      let b = gb / BPB;
      let o = gb % BPB;
      var byte = 0u;
      if (o < HDR) {
        byte = (s_hdr[b] >> (8u * o)) & 0xFFu;
      } else if (QH == 1u && o < HDR + 4u) {
        let k = o - HDR;
        for (var m = 0u; m < 8u; m = m + 1u) { byte = byte | (((s_code[32u * b + 8u * k + m] >> 4u) & 1u) << m); }
      } else {
        let j = o - HDR - 4u * QH;
        if (TYPE == 0u) {
          byte = s_code[32u * b + j];
        } else {
          byte = (s_code[32u * b + j] & 0xFu) | ((s_code[32u * b + j + 16u] & 0xFu) << 4u);
        }
      }
      word = word | (byte << (8u * l));
    }
    store_w(which, dst + w, word);
  }
}
