// Paged decode in three phases over workgroup memory ("logits in shared", like vLLM's paged attention v2,
// with the GQA group's K/V loads shared): kvviz's fast decode, tile kernel. kvviz/kernels/fast_decode_tile.py
// renders it for one cache format and shape; the {{...}} blocks are generated there.
//
// Grid (num_partitions, num_kv_heads, num_seqs); one workgroup = one partition of one sequence for one KV head
// and its G query heads. Unlike fast/decode_split.wgsl (an online softmax with every lane holding a slice of the
// G queries and accumulators), a lane here holds almost nothing across tokens, so many more warps fit a
// compute unit and their loads overlap:
//   A. logits: LA lanes a token (each LA-th code word of the record, so a lane group's loads are contiguous),
//      each lane's slices of the G queries in registers, the LA partial dots summed by subgroupShuffleXor; the
//      logit (base 2: q pre-scaled by scale*log2(e), times the token's K scale) goes to workgroup memory;
//   B. the partition's max per head, then p = 2^(s - m), l = sum p and the weight p * (V scale) in place;
//   C. P.V: LC = D/4 lanes a token row (a lane owns one code word: 4 dims), RC rows of tokens in flight,
//      then the RC rows' accumulators are summed through workgroup memory.
// The partition's unnormalised state [m, l, acc[0..D)] goes to `partials`; fast/decode_reduce.wgsl combines them.
// Format: {{FORMAT}}; D = {{D}}, G = {{G}}, LA = {{LA}}, UA = {{UA}}, LC = {{LC}}, RC = {{RC}}, UC = {{UC}}.
@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<u32>;
@group(0) @binding(2) var<storage, read> vc: array<u32>;
@group(0) @binding(3) var<storage, read> block_tables: array<u32>;
@group(0) @binding(4) var<storage, read> context_lens: array<u32>;
@group(0) @binding(5) var<storage, read> tensor: array<u32>;
@group(0) @binding(6) var<storage, read_write> partials: array<f32>;
struct P { num_kv_heads: u32, num_heads: u32, block_size: u32, max_blocks: u32, partition_tokens: u32, num_partitions: u32, scale_log2: f32 }
var<immediate> p: P;

const D: u32 = {{D}}u;        // head size
const G: u32 = {{G}}u;        // query heads of the KV head
const WG: u32 = {{WG}}u;      // threads of a workgroup
const CW: u32 = {{CW}}u;      // code words of a record (4 codes a word)
const WPT: u32 = {{WPT}}u;    // words of a record (codes, then the token's scale word if any)
const BS: u32 = {{BS}}u;      // block size
const LA: u32 = {{LA}}u;      // lanes a token in phase A
const NA: u32 = {{NA}}u;      // tokens of one phase-A pass of the workgroup (WG / LA)
const UA: u32 = {{UA}}u;      // tokens a lane group takes per phase-A step
const LC: u32 = {{LC}}u;      // lanes a token row in phase C (one code word each)
const RC: u32 = {{RC}}u;      // token rows of phase C (WG / LC)
const UC: u32 = {{UC}}u;      // tokens a row takes per phase-C step
const PTM: u32 = {{PTM}}u;    // the most tokens a partition may have (workgroup memory)
const EMPTY: f32 = -1.0e30;   // m of a partition without tokens (finite: exp2(EMPTY - M) = 0 in the reduce)
var<workgroup> qs: array<vec4<f32>, {{QS}}>;   // the G pre-scaled queries, head-major
var<workgroup> wl: array<f32, {{WL}}>;         // [token][head] logits, then weights; then the phase-C merge
var<workgroup> rows: array<u32, PTM>;           // each token's record offset in the cache (words)
var<workgroup> red: array<f32, {{RED}}>;        // [head][thread] partial max / sum

{{HELPERS}}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32{{SG_PARAM}}) {
  let part = wid.x;
  let kvh = wid.y;
  let seq = wid.z;
  let t0 = part * p.partition_tokens;
  let t1 = min(context_lens[seq], t0 + p.partition_tokens);
  let n = select(0u, t1 - t0, t1 > t0);
  let bt = seq * p.max_blocks;
  let qb = (seq * p.num_heads + kvh * G) * D;
  for (var i = li; i < G * CW; i = i + WG) {
    let b = qb + 4u * i;
    qs[i] = vec4<f32>(q[b], q[b + 1u], q[b + 2u], q[b + 3u]) * p.scale_log2;
  }
  for (var i = li; i < n; i = i + WG) {
    let tt = t0 + i;
    rows[i] = ((block_tables[bt + tt / BS] * p.num_kv_heads + kvh) * BS + tt % BS) * WPT;
  }
{{SCALES}}
  workgroupBarrier();
  // ---- A: logits
  let la = li % LA;
  let tg = li / LA;
{{QREG}}
  for (var i0 = 0u; i0 < n; i0 = i0 + NA * UA) {
{{PHASE_A}}
  }
  {{SG_GUARD}}
  workgroupBarrier();
  // ---- B: the partition's max per head, the weights and l
{{PHASE_B}}
  // ---- C: P.V
  let lc = li % LC;
  let rc = li / LC;
{{PHASE_C_PRO}}
  for (var i0 = rc; i0 < n; i0 = i0 + RC * UC) {
{{PHASE_C}}
  }
  workgroupBarrier();
{{MERGE}}
}
