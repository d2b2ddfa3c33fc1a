// Split-K paged decode ("flash-decoding") reading the NVFP4 cache in place: kvviz's fast nvfp4 decode.
// kvviz/families/fp4/decode.py renders it for one shape; the {{...}} code blocks come from the template
// fp4/decode_fast.wgsl.j2, unrolled per query head, token and vec4 (naga clamps dynamic indices of private arrays,
// which then leave registers).
//
// Record (kvviz/families/fp4/format.py): words 0..SW-1 the E4M3 scale bytes (byte s = sub-block s of 16 elements),
// then 2 code words a sub-block (byte i: element 16s+i in the low nibble, 16s+8+i in the high one);
// paged [num_blocks, kv_heads, block_size, WPT] u32; the tensor scales s_t in `tensor` words 2 (K) and 3 (V).
// Grid (num_partitions, num_kv_heads, num_seqs); one workgroup = one partition of one sequence for one KV
// head and the G query heads of its GQA group (every K/V word loaded once for G heads). RG row groups x L
// lanes; lane l owns DPL = D/L consecutive dims (inside one sub-block, or whole sub-blocks): per token it
// reads its scale byte(s) and code words, codes x e4m3 become exact f32 values (e2m1x4, fp8x4), dotted with
// its slice of the queries (pre-scaled by scale*log2(e)*s_t K); the L partial logits are summed (or
// reduce-scattered) by subgroup shuffles; online softmax in base 2; P.V accumulates (p*s_t V) * values.
// The row groups merge through workgroup memory; row group 0 writes the partition's [m, l, acc[0..D)] to
// `partials`, and attention/split_reduce.wgsl combines the partitions (or, folded, the last workgroup of each
// (sequence, KV head) does: attention/split_fold.wgsl).
// Variant (default off): q as int8 records (codes + f32 scale, one a head) dotted by dot4I8Packed with the E2M1 values
// doubled, e4m3 * dot a sub-block (kvviz/families/fp4/decode.py says how).
// Format: {{FORMAT}}; D = {{D}}, G = {{G}}, L = {{L}}, RG = {{RG}}, U = {{U}}; variant: {{VARIANT}}.
@group(0) @binding(0) var<storage, read> q: array<{{Q_TYPE}}>;
@group(0) @binding(1) var<storage, read> kc: array<u32>;
@group(0) @binding(2) var<storage, read> vc: array<u32>;
@group(0) @binding(3) var<storage, read> block_tables: array<u32>;
@group(0) @binding(4) var<storage, read> context_lens: array<u32>;
@group(0) @binding(5) var<storage, read> tensor: array<u32>;
@group(0) @binding(6) var<storage, read_write> partials: array<f32>;
struct P { num_kv_heads: u32, num_heads: u32, block_size: u32, max_blocks: u32, partition_tokens: u32, num_partitions: u32, scale_log2: f32 }
var<immediate> p: P;

// #include "attention/split_common.wgsl"
const WPT: u32 = {{WPT}}u;   // u32 words of one token's record
const SW: u32 = {{SW}}u;     // its E4M3 scale words (the codes start after them)

{{HELPERS}}
{{FOLD_DECLS}}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32{{SG_PARAM}}) {
// #include "attention/split_entry.wgsl"
// #include "attention/split_loop.wgsl"
{{FOLD}}
}
