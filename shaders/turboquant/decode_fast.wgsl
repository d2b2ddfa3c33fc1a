// Split-K decode ("flash-decoding") over TurboQuant's seed cache, read in place: kvviz's fast TurboQuant decode.
// kvviz/families/turboquant/decode.py renders it for one head size, GQA group and lane layout; the {{...}} code blocks
// come from the template turboquant/decode_fast.wgsl.j2, unrolled per query head and per token (naga clamps dynamic
// indices of private arrays).
//
// The cache is the seed's (kvviz/families/turboquant/format.py): ONE sequence per buffer, not paged (turboquant/decode_fast_paged.wgsl
// is the paged variant over per-token records), regions
//   keys   [polar: slot*PW words | jl: slot*JW words | norms: pack2x16float(n, rn) at slot]
//   values [polar: slot*PW words | norms: pack2x16float(n, 0) at slot],   slot = kv_head * cache_cap + t.
// One dispatch per sequence (its own cache buffers and its own partials [H, P_s, D+2], so the splits carry no
// write-after-write hazard and overlap); grid (partitions of that sequence, num_kv_heads, 1).
// One workgroup = one partition of one sequence for one KV head and the G query heads of its GQA group.
//
// Per token (the seed flash_attention_tq's estimator, arXiv:2504.19874):
//   logit = n * (<q_rot, c[idx]> + rn * qjl_scale * sum_j q_jl[j] * (2 bit_j - 1)) * scale
// q_rot / q_jl come from tq_rotate_q (rotated once per decode); here pre-scaled by scale*log2(e)
// (and qjl_scale), so the online softmax is in base 2. The 2-bit codes select one of 4 centroids;
// the QJL bits flip the sign of q_jl (xor of the f32 sign bit). Values accumulate n_v * p * c[vidx]
// in the ROTATED space; turboquant/decode_fast_reduce.wgsl combines the partitions and applies the inverse
// rotation once per output (as the seed's epilogue does).
// Lanes: L lanes share a token row, lane l owns DPL = D/L consecutive rotated dims (a multiple of 16: whole
// polar words); the L partial logits are summed by subgroupShuffleXor. L = 1 without subgroups.
// Shape: D = {{D}}, G = {{G}}, L = {{L}}, RG = {{RG}}, U = {{U}}.
@group(0) @binding(0) var<storage, read> qrot: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<u32>;
@group(0) @binding(2) var<storage, read> vc: array<u32>;
@group(0) @binding(3) var<storage, read_write> partials: array<f32>;
struct P { num_heads: u32, num_kv_heads: u32, cache_cap: u32, seq_len: u32, seq: u32, partition_tokens: u32, num_partitions: u32, q_region: u32, scale_log2: f32, qjl_log2: f32, c0: f32, c1: f32, c2: f32, c3: f32 }
var<immediate> p: P;

// #include "attention/split_common.wgsl"
// #include "turboquant/fast_common.wgsl"


@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32{{SG_PARAM}}) {
  let part = wid.x;
  let kvh = wid.y;
  let seq = p.seq;
  let lane = li % L;
  let rg = li / L;
  let t0 = part * p.partition_tokens;
  let t1 = min(p.seq_len, t0 + p.partition_tokens);
  let vecs = p.num_kv_heads * p.cache_cap;
  let jl_off = vecs * PW;
  let kn_off = jl_off + vecs * JW;
  let vn_off = vecs * PW;
  let sbase = kvh * p.cache_cap;
  let qb = (seq * p.num_heads + kvh * {{G}}u) * D + lane * DPL;
  let lw = lane * WPL;
  let cv0 = vec4<f32>(p.c0);
  let cv1 = vec4<f32>(p.c1);
  let cv2 = vec4<f32>(p.c2);
  let cv3 = vec4<f32>(p.c3);
  let ONE = vec4<f32>(1.0);
// #include "attention/split_loop.wgsl"
}
