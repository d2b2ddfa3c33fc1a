// #include "common/quant.wgsl"
// KIVI key writer ({{BITS}}-bit): keys quantised PER CHANNEL over groups of 32 consecutive positions
// [32g, 32g+32) of one sequence (only positions < n_q, so groups are always full).
// One 128-thread workgroup per (group, kv head): grid (groups, kv_heads, 1).
// key_g: the group's 32 key rows gathered on the host, [groups, 32, kv_heads, hd] f32; slots_g: their slots.
// groups[i] = (seq, g, 0, 0); info = [seq_info (4 words a sequence) | block tables (mbs words a sequence)].
// Per channel c: min / max over the 32 tokens, scale = (max-min)/LEVELS (0 if degenerate), zero = min.
// Side stream of a sequence (per kv head): word 2D*g + 2c = scale, 2D*g + 2c + 1 = zero of channel c in
// group g; word o of the stream lives in logical block o / WS of the sequence (physical block from its
// block table), at K-buffer word bs*KW + o % WS of that (block, head); WS = hd*bs/16 side words a block,
// i.e. exactly 2 f32 per channel per 32 tokens.
@group(0) @binding(0) var<storage, read> key_g: array<f32>;
@group(0) @binding(1) var<storage, read> slots_g: array<u32>;
@group(0) @binding(2) var<storage, read> groups: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> info: array<u32>;
@group(0) @binding(4) var<storage, read_write> k_cache: array<u32>;
struct P { kvh: u32, hd: u32, bs: u32, kstride: u32, bt_off: u32, mbs: u32 }
var<immediate> p: P;
const WG: u32 = 128u;
const BITS: u32 = {{BITS}}u;
const LEVELS: u32 = (1u << BITS) - 1u;
const CPW: u32 = 32u / BITS;
var<workgroup> s_scale: array<f32, 256>;
var<workgroup> s_zero: array<f32, 256>;

fn side_word(seq: u32, h: u32, o: u32) -> u32 {
  let ws = p.hd * p.bs / 16u;
  let phys = info[p.bt_off + seq * p.mbs + o / ws];
  return (phys * p.kvh + h) * p.kstride + p.bs * (p.hd * BITS / 32u) + o % ws;
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let gi = wg.x;
  let h = wg.y;
  let tid = lid.x;
  let seq = groups[gi].x;
  let g = groups[gi].y;
  for (var c = tid; c < p.hd; c = c + WG) {
    var kmin = 0xFFFFFFFFu;
    var kmax = 0u;
    for (var i = 0u; i < 32u; i = i + 1u) {
      let k = order_key(bitcast<u32>(key_g[((gi * 32u + i) * p.kvh + h) * p.hd + c]));
      kmin = min(kmin, k);
      kmax = max(kmax, k);
    }
    let mn = bitcast<f32>(key_bits(kmin));
    let scale = asym_scale(mn, bitcast<f32>(key_bits(kmax)), LEVELS);
    s_scale[c] = scale;
    s_zero[c] = mn;
    let o = 2u * p.hd * g + 2u * c;
    k_cache[side_word(seq, h, o)] = bitcast<u32>(scale);
    k_cache[side_word(seq, h, o + 1u)] = bitcast<u32>(mn);
  }
  workgroupBarrier();
  let kw = p.hd * BITS / 32u;
  for (var idx = tid; idx < 32u * kw; idx = idx + WG) {
    let i = idx / kw;
    let w = idx % kw;
    let slot = slots_g[gi * 32u + i];
    let src = ((gi * 32u + i) * p.kvh + h) * p.hd + w * CPW;
    var word = 0u;
    for (var l = 0u; l < CPW; l = l + 1u) {
      let c = w * CPW + l;
      word = word | (asym_code(key_g[src + l], s_zero[c], s_scale[c], LEVELS) << (BITS * l));
    }
    k_cache[((slot / p.bs) * p.kvh + h) * p.kstride + (slot % p.bs) * kw + w] = word;
  }
}
