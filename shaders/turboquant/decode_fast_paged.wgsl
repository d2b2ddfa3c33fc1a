// Split-K decode ("flash-decoding") over a PAGED TurboQuant cache (the seed configuration), read in place.
// kvviz/families/turboquant/decode.py renders it (render(..., paged=True)) for one head size, GQA group, lane layout
// and block size (the template turboquant/decode_fast.wgsl.j2); the per-token arithmetic is
// turboquant/decode_fast.wgsl's (the per-sequence cache's decode), only the addressing differs.
//
// The cache: per-token records in [num_blocks, num_kv_heads, block_size, W] u32 (kvviz/families/turboquant/format.py,
// "general settings", at bits 2 / v_bits 2 without outliers: the seed compressor's words, per token):
//   keys   W = WK: [polar: PW words | jl: JW words | pack2x16float(n, rn)]
//   values W = WV: [polar: PW words | pack2x16float(n, 0)]
// written by tq_general_compress through the batch's slot mapping. A token's record index is
// (block_tables[seq][t / block_size] * num_kv_heads + kv_head) * block_size + t % block_size
// (fast_decode.step_loads, with its prefetch of the next step's block-table entries and words).
//
// ONE dispatch for the batch: grid (num_partitions, num_kv_heads, num_seqs); one workgroup = one partition of one
// sequence for one KV head and the G query heads of its GQA group. Partials [S, H, num_partitions, D + 2]
// (m, l, acc in the ROTATED space, base 2); turboquant/decode_fast_reduce.wgsl, one dispatch of grid (H, S, 1), combines
// them and applies the inverse rotation. q_rot / q_jl come from tq_rotate_q (all sequences, one dispatch),
// pre-scaled here by scale*log2(e) (and qjl_scale); or, for the int8-query variant, the host's query records
// [S, H, D/4 polar code words | D/4 QJL code words | f32 scale of each] (decode.py query_records_i8).
// Shape: D = {{D}}, G = {{G}}, L = {{L}}, RG = {{RG}}, U = {{U}}.
// qrot: f32 q_rot | q_jl, or u32 int8 query records
@group(0) @binding(0) var<storage, read> qrot: array<{{QT}}>;
@group(0) @binding(1) var<storage, read> kc: array<u32>;
@group(0) @binding(2) var<storage, read> vc: array<u32>;
@group(0) @binding(3) var<storage, read> block_tables: array<u32>;
@group(0) @binding(4) var<storage, read> context_lens: array<u32>;
@group(0) @binding(5) var<storage, read_write> partials: array<f32>;
struct P { num_heads: u32, num_kv_heads: u32, block_size: u32, max_blocks: u32, partition_tokens: u32, num_partitions: u32, q_region: u32, scale_log2: f32, qjl_log2: f32, c0: f32, c1: f32, c2: f32, c3: f32 }
var<immediate> p: P;

// #include "attention/split_common.wgsl"
// #include "turboquant/fast_common.wgsl"
const WK: u32 = {{WK}}u;     // words of a key record
const WV: u32 = {{WV}}u;     // words of a value record
const WPT: u32 = 1u;         // step_loads' row is the record index; WK / WV scale it per cache

{{HELPERS}}


@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32{{SG_PARAM}}) {
// #include "attention/split_entry.wgsl"
  let lw = lane * WPL;
  let cv0 = vec4<f32>(p.c0);
  let cv1 = vec4<f32>(p.c1);
  let cv2 = vec4<f32>(p.c2);
  let cv3 = vec4<f32>(p.c3);
  let ONE = vec4<f32>(1.0);
// #include "attention/split_loop.wgsl"
}
