// Split-K paged decode ("flash-decoding") reading a packed KV cache in place: kvviz's fast decode.
// kvviz/attention/split_decode.py renders it for one cache format and shape; the {{...}} code blocks come from
// the template attention/split_decode.wgsl.j2, unrolled per query head and per token, because naga clamps every
// dynamic index of a private array and the arrays then leave registers (2x slower on an H200, docs/fast-kernels.md s.8);
// or, on a software rasteriser, from attention/split_looped.wgsl.j2: loops over a lane's dims, the state in workgroup
// memory, so the code does not grow with the head size (its grid's y is then KV heads x chunks of the GQA group).
//
// Grid (num_partitions, num_kv_heads, num_seqs). One workgroup = one partition of one sequence for
// one KV head and all G query heads of its GQA group, so every K/V word is loaded once for G heads.
// Workgroup = RG row groups x L lanes. A row group takes U tokens per step; lane l owns DPL = D/L
// consecutive dims of every row. Per token: each lane dots its codes with its slice of the G queries,
// the L lanes sum by subgroupShuffleXor (L <= the adapter's subgroup size, probed at start), the per-token
// scales multiply the logit and the probability (codes never become an f32 copy of the cache), and
// an online softmax in base 2 (the query is pre-scaled by scale*log2(e)) keeps (m, l, acc).
// The RG row groups merge through workgroup memory; row group 0 writes the partition's unnormalised
// [m, l, acc[0..D)] to `partials`, and attention/split_reduce.wgsl combines the partitions (or, folded, the last
// workgroup of each (sequence, KV head) does: attention/split_fold.wgsl).
// Format: {{FORMAT}}; D = {{D}}, G = {{G}}, L = {{L}}, RG = {{RG}}, U = {{U}}; variant: {{VARIANT}}.
// Variants (default off): q as int8 records (codes + f32 scale, like the int8 cache) dotted with dot4I8Packed;
// P.V accumulated in f16 and flushed to the f32 accumulator every few steps (fast_decode.py says how).
{{ENABLES}}
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
const WPL: u32 = {{WPL}}u;   // code words per lane

{{HELPERS}}
{{FOLD_DECLS}}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32{{SG_PARAM}}) {
// #include "attention/split_entry.wgsl"
  let lw = lane * WPL;
  let kstride = p.num_kv_heads * p.block_size;
// #include "attention/split_loop.wgsl"
{{FOLD}}
}
