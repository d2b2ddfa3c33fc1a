// Split-K decode ("flash-decoding") over KIVI's paged cache, read in place: kvviz's fast KIVI decode.
// kvviz/families/kivi/decode.py renders it for one bit width, head size, GQA group and lane layout; the
// {{...}} code blocks come from the template kivi/decode_fast.wgsl.j2, unrolled per query head and per vec4 (naga
// clamps dynamic indices of
// private arrays, and those arrays then leave registers).
//
// Cache (kvviz/families/kivi/format.py), u32 words, KW = D*bits/32 code words a token, WS = D*bs/16:
//   K   [num_blocks, kv_heads, bs*KW + WS]: token o's KW code words at o*KW, then WS words of the sequence's
//       side stream (stream word 2D*g + 2c = scale, +1 = zero of channel c for key group g of 32 tokens;
//       stream word o lives in the sequence's logical block o / WS at offset o % WS);
//   V   [num_blocks, kv_heads, bs*(KW + 2)]: per token KW code words, f32 scale, f32 zero;
//   res [rows, 2 (K, V), kv_heads, D] f32: positions [n_q, L) of a sequence at row res_off + t - n_q;
//   info: [S, 4] (context_len, n_q, res_off, 0), then the block tables [S, max_blocks] at bt_off.
// Grid (num_partitions, num_kv_heads, num_seqs); one workgroup = one partition (a multiple of 32 tokens) of one
// sequence for one KV head and the G query heads of its GQA group. Workgroup = RG row groups x L lanes; lane l
// owns DPL = D/L consecutive channels; the L partial logits are summed by subgroupShuffleXor (L = 1 without
// subgroups).
//
// Quantised keys [t0, min(t1, n_q)): whole key groups. R = 32/TG row groups share a group (TG tokens each), so
// a sweep of the workgroup covers RG/R groups. Per group each lane reads its channels' (scale, zero) once and
// folds them into the query: k = code*s + z, so q.k = sum_c (q_c s_c) code_c + sum_c q_c z_c; qk = q*s and the
// lane's bias sum q_c z_c (q pre-scaled by scale*log2 e) serve the group's tokens: logit = dot(qk, codes) +
// bias, no dequantised key. Values per token: p*(code*s + z) = (p*s)*code + p*z: (p*s)*code goes into the
// accumulator, p*z into one scalar per head (rescaled with the online max like the accumulator) that is added
// to every channel once, after the loops.
// Residual rows [max(t0, n_q), t1): a second loop over the f32 rows (the f32 fast decode's step), same state.
// The int8-query variant (qk "i8"): per key group and head the folded query qk is quantised to int8 codes with a
// power-of-two step (kivi/query_i8.wgsl), and a token's logit is the integer dot4I8Packed of those codes with the
// K codes' bytes, times the step, + bias; the residual rows keep the f32 query.
// Online softmax in base 2; the row groups merge through workgroup memory; row group 0 writes the partition's
// [m, l, acc[0..D)] to `partials`, combined by attention/split_reduce.wgsl (shared with the other fast decodes).
// Shape: bits = {{BITS}}, D = {{D}}, G = {{G}}, L = {{L}}, RG = {{RG}}, U = {{U}}, TG = {{TG}}; query: {{VARIANT}}.
@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<u32>;
@group(0) @binding(2) var<storage, read> vc: array<u32>;
@group(0) @binding(3) var<storage, read> res: array<f32>;
@group(0) @binding(4) var<storage, read> info: array<u32>;
@group(0) @binding(5) var<storage, read_write> partials: array<f32>;
struct P { num_kv_heads: u32, num_heads: u32, block_size: u32, max_blocks: u32, bt_off: u32, kstride: u32, ws: u32, partition_tokens: u32, num_partitions: u32, scale_log2: f32 }
var<immediate> p: P;

// #include "attention/split_common.wgsl"
const KW: u32 = {{KW}}u;     // code words of one token
const VW: u32 = {{VW}}u;     // words of one V record: KW codes, scale, zero
const TG: u32 = {{TG}}u;     // tokens of a key group one row group takes
const R: u32 = {{R}}u;       // row groups sharing a key group (32 / TG)
const GPS: u32 = {{GPS}}u;   // key groups a sweep of the workgroup covers (RG / R)
const WPL: u32 = {{WPL}}u;   // code words per lane (0: lanes do not own whole words, a vec4 reads its own word)

{{HELPERS}}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32{{SG_PARAM}}) {
  let part = wid.x;
  let kvh = wid.y;
  let seq = wid.z;
  let lane = li % L;
  let rg = li / L;
  let ctx_len = info[seq * 4u];
  let nq = info[seq * 4u + 1u];
  let res_off = info[seq * 4u + 2u];
  let t0 = part * p.partition_tokens;
  let t1 = min(ctx_len, t0 + p.partition_tokens);
  let qb = (seq * p.num_heads + kvh * {{G}}u) * D + lane * DPL;
  let lw = lane * WPL;
  let bt = p.bt_off + seq * p.max_blocks;
  let kside = p.block_size * KW;  // the side stream's first word in a (block, head) of K
  let gslot = rg / R;             // which key group of a sweep this row group takes
  let sub = rg % R;               // which TG tokens of that group
  let g0 = t0 / 32u;              // the partition's quantised key groups [g0, g1)
  let g1 = min(t1, nq) / 32u;
{{PROLOGUE}}
  // ---- quantised key groups [g0, g1): every row group runs the same number of sweeps and steps (uniform
  // control flow for the shuffles); a row group past g1 loads group g1 - 1 and masks its logits.
  for (var gb = g0; gb < g1; gb = gb + GPS) {
{{GROUP}}
    for (var st = 0u; st < TG / U; st = st + 1u) {
{{QSTEP}}
    }
  }
  // ---- residual f32 rows [max(t0, n_q), t1)
  for (var tb = max(t0, nq); tb < t1; tb = tb + RG * U) {
{{RSTEP}}
  }
{{FOLD}}
  // Merge the row groups: a tree over workgroup memory, all heads at once.
{{MERGE}}
  {{SG_GUARD}}
  if (rg == 0u) {
{{WRITE}}
  }
}
