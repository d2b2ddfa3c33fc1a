// Second pass of the split attention-weights kernels (paged_attn_weights.comp, tq_scores.wgsl):
// rows of logits whose partitions of PARTITION positions each left (m_p, s_p = sum e^(l - m_p))
// in `stats` become softmax weights, in place:
//   M = max_p m_p;  L = sum_p s_p e^(m_p - M)
//   normaliser 0 (the paged decodes'):        w = e^(l - M) * (1 / (L + 1e-6))
//   normaliser 1 (the TurboQuant seed's):     w = e^(l - M) / L
// Positions at or past the row's length (up to row_len) are written 0.
// Row r = workgroup_id.y * num_heads + workgroup_id.x: stats[r * num_partitions * 2 ..] and
// out[(r + row_base * num_heads) * row_len ..]; row_lens[workgroup_id.y] = the row's length (clamped by the host).
// Grid: (num_heads, rows, ceil(row_len / PARTITION)), 128 threads; one workgroup normalises one partition.
@group(0) @binding(0) var<storage, read> stats: array<f32>;
@group(0) @binding(1) var<storage, read> row_lens: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
struct P { num_heads: u32, row_len: u32, num_partitions: u32, normaliser: u32, row_base: u32 }
var<immediate> p: P;
const WG: u32 = 128u;
const PARTITION: u32 = 512u;
const NEG_MAX: f32 = -3.402823466e38;
var<workgroup> s_red: array<f32, 128>;

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let r = wid.y * p.num_heads + wid.x;          // this dispatch's row: stats and row_lens
  let r_out = (p.row_base + wid.y) * p.num_heads + wid.x;  // the row in `out`
  let tid = lid.x;
  let len = min(row_lens[wid.y], p.row_len);
  let np = len / PARTITION + select(0u, 1u, len % PARTITION != 0u);
  let sb = r * p.num_partitions * 2u;

  var m = NEG_MAX;
  for (var i = tid; i < np; i = i + WG) { m = max(m, stats[sb + 2u * i]); }
  s_red[tid] = m;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (tid < s) { s_red[tid] = max(s_red[tid], s_red[tid + s]); }
    workgroupBarrier();
  }
  let gmax = s_red[0];
  workgroupBarrier();
  var l = 0.0;
  for (var i = tid; i < np; i = i + WG) { l = l + stats[sb + 2u * i + 1u] * exp(stats[sb + 2u * i] - gmax); }
  s_red[tid] = l;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (tid < s) { s_red[tid] = s_red[tid] + s_red[tid + s]; }
    workgroupBarrier();
  }
  let total = s_red[0];
  let inv_sum = 1.0 / (total + 1e-6);

  let o_base = r_out * p.row_len;
  let t_end = min(wid.z * PARTITION + PARTITION, p.row_len);
  for (var t = wid.z * PARTITION + tid; t < t_end; t = t + WG) {
    var w = 0.0;
    if (t < len) {
      let e = exp(out[o_base + t] - gmax);
      w = select(e * inv_sum, e / total, p.normaliser == 1u);
    }
    out[o_base + t] = w;
  }
}
