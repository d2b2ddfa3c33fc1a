// Split-K paged decode ("flash-decoding") reading a llama.cpp block-type cache (q8_0, q4_0, q4_1, q5_0, q5_1,
// iq4_nl, mxfp4) in place: kvviz's fast ggml decode. kvviz/families/ggml/decode.py renders it for one type
// and shape; the {{...}} code blocks come from the template ggml/decode_fast.wgsl.j2, unrolled per query head,
// token and vec4 (naga clamps
// dynamic indices of private arrays, which then leave registers).
//
// Record: a token's ggml row (D/32 blocks of BPB bytes, byte for byte as ggml lays them out) padded to whole
// u32 words; paged [num_blocks, kv_heads, block_size, WPT] u32. Blocks are NOT word aligned (q8_0 block b
// starts at byte 34b): a lane loads the words covering its bytes and funnel-shifts them,
//   word j = (w[j] >> sr) | ((w[j+1] << ((32 - sr) & 31)) & hm),  hm = 0 when sr = 0
// (WGSL shifts take the amount mod 32, so a shift by 32 is the mask `hm`, not a shift).
// Grid (num_partitions, num_kv_heads, num_seqs); one workgroup = one partition of one sequence for one KV
// head and the G query heads of its GQA group (every K/V word loaded once for G heads). RG row groups x L
// lanes; lane l owns DPL = D/L consecutive dims that lie inside one 32-element block (or whole blocks), reads
// its block's scale (f16 d, and m for q4_1 / q5_1; E8M0 e for mxfp4) and its code bytes; logit =
// sum over its blocks of d * dot(q, codes) (+ m * sum q), the L partial logits summed by subgroupShuffleXor;
// online softmax in base 2 (q pre-scaled by scale*log2(e)); P.V accumulates p*d*codes (+ p*m).
// The row groups merge through workgroup memory; row group 0 writes the partition's [m, l, acc[0..D)] to
// `partials`, and attention/split_reduce.wgsl combines the partitions (or, folded, the last workgroup of each
// (sequence, KV head) does: attention/split_fold.wgsl).
// Variant (default off): q as int8 records (codes + f32 scale, one a head) dotted with the codes by dot4I8Packed,
// d * dot (+ m * the query codes' sum) a block (kvviz/families/ggml/decode.py says how).
// Type: {{FORMAT}}; D = {{D}}, G = {{G}}, L = {{L}}, RG = {{RG}}, U = {{U}}; variant: {{VARIANT}}.
@group(0) @binding(0) var<storage, read> q: array<{{Q_TYPE}}>;
@group(0) @binding(1) var<storage, read> kc: array<u32>;
@group(0) @binding(2) var<storage, read> vc: array<u32>;
@group(0) @binding(3) var<storage, read> block_tables: array<u32>;
@group(0) @binding(4) var<storage, read> context_lens: array<u32>;
@group(0) @binding(5) var<storage, read_write> partials: array<f32>;
struct P { num_kv_heads: u32, num_heads: u32, block_size: u32, max_blocks: u32, partition_tokens: u32, num_partitions: u32, scale_log2: f32 }
var<immediate> p: P;

// #include "attention/split_common.wgsl"
const WPT: u32 = {{WPT}}u;   // u32 words of one token's record
const BPB: u32 = {{BPB}}u;   // bytes of one 32-element block

{{HELPERS}}
{{FOLD_DECLS}}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32{{SG_PARAM}}) {
// #include "attention/split_entry.wgsl"
  let e0 = (lane * DPL) % 32u;  // this lane's first element inside its block
// #include "attention/split_loop.wgsl"
{{FOLD}}
}
