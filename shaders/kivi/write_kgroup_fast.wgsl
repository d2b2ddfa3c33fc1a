// #include "common/quant.wgsl"
// #include "common/write_fast.wgsl"
// Fast KIVI key-group writer ({{BITS}}-bit), the words of kivi/write_kgroup.wgsl: keys quantised PER
// CHANNEL over a group of 32 consecutive positions [32g, 32g+32) of one sequence. The group's rows are read
// in place from the key input through their token-row indices (grows: 32 a group; nothing gathered on the
// host), so a group can be written when it fills (a live append) as well as in a prefill.
//
// One workgroup per (group, KV head): its TG = RS x NV4 threads load the group's 32 x NV4 vec4 tile once, all
// loads of a thread issued together: thread t holds vec4 c4 = t % NV4 of the J = 32 / RS rows rs + RS j
// (rs = t / NV4), so consecutive threads read consecutive vec4s of a row. Each thread reduces min / max of its
// 4 channels over its J rows; the RS partial results meet in workgroup memory. Then each thread quantises
// the values it holds (branch-free asym_codes4v_fast; a row with an unsure code is redone exactly from the input, a
// runtime loop so the exact division is not inlined J times) into its share of a code word, the shares meet in
// workgroup memory (the same array: the min / max are dead by then) and the threads store the group's
// 32 x KW code words, consecutive threads at consecutive words of a row. (It replaced a kernel with a thread per
// (group, head, code word) that read every row twice, one row a step: 32 dependent steps a thread.)
// LANES = {{LANES}} and the reduce helpers of write_common are unused here. Grid: 2-D over groups * kv_heads.
// groups[i] = (seq, g, 0, 0); info = [seq_info (4 words a sequence) | block tables (mbs words a sequence)].
// Side stream of a sequence (per kv head): word 2D*g + 2c = scale, 2D*g + 2c + 1 = zero of channel c, in
// logical block o / WS of the sequence at K-buffer word bs*KW + o % WS of that (block, head); WS = hd*bs/16.
@group(0) @binding(0) var<storage, read> key_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> slots: array<u32>;
@group(0) @binding(2) var<storage, read> grows: array<u32>;
@group(0) @binding(3) var<storage, read> groups: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> info: array<u32>;
@group(0) @binding(5) var<storage, read_write> k_cache: array<u32>;
struct P { kvh: u32, hd: u32, bs: u32, kstride: u32, bt_off: u32, mbs: u32, items: u32, gx: u32 }
var<immediate> p: P;
const BITS: u32 = {{BITS}}u;
const LEVELS: u32 = (1u << BITS) - 1u;
const CPW: u32 = 32u / BITS;   // channels a code word
const VPU: u32 = CPW / 4u;     // vec4s a code word
const NV4: u32 = {{NV4}}u;     // vec4s a row (head size / 4)
const KW: u32 = NV4 / VPU;     // code words a row
const RS: u32 = {{RS}}u;       // row sets
const J: u32 = 32u / RS;       // rows a thread
const TG: u32 = RS * NV4;      // threads a workgroup
// min / max keys (8 words a thread), then the code-word shares (32 x NV4 words)
var<workgroup> s_buf: array<u32, {{SBUF}}>;  // max(8 TG, 32 NV4)

fn side_word(seq: u32, h: u32, o: u32) -> u32 {
  let ws = p.hd * p.bs / 16u;
  let phys = info[p.bt_off + seq * p.mbs + o / ws];
  return (phys * p.kvh + h) * p.kstride + p.bs * KW + o % ws;
}

// The exact codes clamp(round(div_rn(x - z, s)), 0, LEVELS) of 4 channels (0 where s = 0).
fn exact_codes4(x: vec4<f32>, z: vec4<f32>, s: vec4<f32>) -> vec4<u32> {
  var c = vec4<u32>(0u);
  for (var l = 0u; l < 4u; l = l + 1u) {
    if (s[l] != 0.0) { c[l] = u32(clamp(round(div_rn(x[l] - z[l], s[l])), 0.0, f32(LEVELS))); }
  }
  return c;
}

fn put4(i: u32, v: vec4<u32>) {
  s_buf[4u * i] = v.x; s_buf[4u * i + 1u] = v.y; s_buf[4u * i + 2u] = v.z; s_buf[4u * i + 3u] = v.w;
}
fn get4(i: u32) -> vec4<u32> { return vec4<u32>(s_buf[4u * i], s_buf[4u * i + 1u], s_buf[4u * i + 2u], s_buf[4u * i + 3u]); }

@compute @workgroup_size(TG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let item = wg.y * p.gx + wg.x;  // (group, head): the same for the whole workgroup, so the barriers stay uniform
  if (item >= p.items) { return; }
  let h = item % p.kvh;
  let gi = item / p.kvh;
  let seq = groups[gi].x;
  let g = groups[gi].y;
  let c4 = lid % NV4;
  let rs = lid / NV4;
  var xs: array<vec4<f32>, J>;
  // @unroll
  for (var j = 0u; j < J; j = j + 1u) { xs[j] = key_in[(grows[gi * 32u + rs + RS * j] * p.kvh + h) * NV4 + c4]; }
  var mn = vec4<u32>(0xFFFFFFFFu);
  var mx = vec4<u32>(0u);
  // @unroll
  for (var j = 0u; j < J; j = j + 1u) {
    let u = bitcast<vec4<u32>>(xs[j]);
    let k = select(u | vec4<u32>(SIGN_BIT), ~u, (u & vec4<u32>(SIGN_BIT)) != vec4<u32>(0u));
    mn = min(mn, k);
    mx = max(mx, k);
  }
  put4(lid, mn);
  put4(TG + lid, mx);
  workgroupBarrier();
  // @unroll
  for (var r = 0u; r < RS; r = r + 1u) {
    mn = min(mn, get4(r * NV4 + c4));
    mx = max(mx, get4(TG + r * NV4 + c4));
  }
  workgroupBarrier();  // s_buf is reused for the code words below
  var zero: vec4<f32>;
  var scale: vec4<f32>;
  var inv: vec4<f32>;
  // @unroll
  for (var l = 0u; l < 4u; l = l + 1u) {
    let z = bitcast<f32>(key_bits(mn[l]));
    let s = asym_scale_fast(z, bitcast<f32>(key_bits(mx[l])), LEVELS);
    zero[l] = z;
    scale[l] = s;
    inv[l] = select(0.0, approx_inv(s), s != 0.0);
    if (rs == 0u) {
      let o = 2u * p.hd * g + 2u * (4u * c4 + l);
      k_cache[side_word(seq, h, o)] = bitcast<u32>(s);
      k_cache[side_word(seq, h, o + 1u)] = bitcast<u32>(z);
    }
  }
  let part = c4 % VPU;  // which share of its code word this thread's 4 channels are
  var unsure = 0u;      // bit j: row rs + RS j has a code asym_codes4v_fast is not sure of
  // @unroll
  for (var j = 0u; j < J; j = j + 1u) {
    let r = asym_codes4v_fast(xs[j], zero, inv, LEVELS);
    s_buf[(rs + RS * j) * NV4 + c4] = pack_codes4(r.c, BITS, part);
    unsure = unsure | select(1u << j, 0u, r.sure);
  }
  // rare (a quotient within 16 ulp of a rounding boundary, a subnormal value): those rows' shares again, exactly
  for (var j = 0u; j < J; j = j + 1u) {
    if ((unsure & (1u << j)) == 0u) { continue; }
    let row = rs + RS * j;
    let x = key_in[(grows[gi * 32u + row] * p.kvh + h) * NV4 + c4];
    s_buf[row * NV4 + c4] = pack_codes4(exact_codes4(x, zero, scale), BITS, part);
  }
  workgroupBarrier();
  // @unroll
  for (var k = 0u; k < 32u * KW / TG; k = k + 1u) {
    let idx = lid + TG * k;
    let row = idx / KW;
    let w = idx % KW;
    var word = 0u;
    // @unroll
    for (var i = 0u; i < VPU; i = i + 1u) { word = word | s_buf[row * NV4 + w * VPU + i]; }
    let slot = slots[grows[gi * 32u + row]];
    k_cache[((slot / p.bs) * p.kvh + h) * p.kstride + (slot % p.bs) * KW + w] = word;
  }
}
