// Combines the partitions of the split paged decode (paged_attn_f32.comp writes them):
//   partials[(seq, head, part)] = [m_p, s_p, acc_p[0..head_size)]   (max logit, sum e^(l-m_p), sum e^(l-m_p) v)
//   M = max_p m_p;  L = sum_p s_p e^(m_p - M);  out[d] = (sum_p acc_p[d] e^(m_p - M)) * 1 / (L + 1e-6)
// over the num_partitions(seq) = ceil(min(context_len, max_context_len) / PARTITION) partitions that
// hold tokens. One partition gives exactly the unsplit kernel's out = acc * (1 / (s + 1e-6)).
// Every loop runs over at most ceil(partitions / 128) or 128 steps, so long contexts stay within
// a software rasteriser's loop budget.
// Grid: (num_heads, num_seqs, 1), 128 threads; thread tid owns output dims tid and tid + 128.
@group(0) @binding(0) var<storage, read> partials: array<f32>;
@group(0) @binding(1) var<storage, read> context_lens: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
struct P { num_heads: u32, head_size: u32, num_partitions: u32, max_context_len: u32 }
var<immediate> p: P;
const WG: u32 = 128u;
const PARTITION: u32 = 512u;
const NEG_MAX: f32 = -3.402823466e38;
var<workgroup> s_red: array<f32, 128>;
var<workgroup> s_f: array<f32, 128>;

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let head = wid.x;
  let seq = wid.y;
  let tid = lid.x;
  let ctx = min(context_lens[seq], p.max_context_len);
  let np = ctx / PARTITION + select(0u, 1u, ctx % PARTITION != 0u);
  let stride = p.head_size + 2u;
  let base = (seq * p.num_heads + head) * p.num_partitions * stride;

  var m = NEG_MAX;
  for (var i = tid; i < np; i = i + WG) { m = max(m, partials[base + i * stride]); }
  s_red[tid] = m;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (tid < s) { s_red[tid] = max(s_red[tid], s_red[tid + s]); }
    workgroupBarrier();
  }
  let gmax = s_red[0];
  workgroupBarrier();

  var l = 0.0;
  for (var i = tid; i < np; i = i + WG) {
    l = l + partials[base + i * stride + 1u] * exp(partials[base + i * stride] - gmax);
  }
  s_red[tid] = l;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (tid < s) { s_red[tid] = s_red[tid] + s_red[tid + s]; }
    workgroupBarrier();
  }
  let inv_sum = 1.0 / (s_red[0] + 1e-6);

  var acc0 = 0.0;
  var acc1 = 0.0;
  for (var c = 0u; c < np; c = c + WG) {
    workgroupBarrier();
    if (c + tid < np) { s_f[tid] = exp(partials[base + (c + tid) * stride] - gmax); }
    workgroupBarrier();
    let n = min(WG, np - c);
    for (var j = 0u; j < n; j = j + 1u) {
      let pb = base + (c + j) * stride + 2u;
      if (tid < p.head_size) { acc0 = acc0 + s_f[j] * partials[pb + tid]; }
      if (tid + WG < p.head_size) { acc1 = acc1 + s_f[j] * partials[pb + tid + WG]; }
    }
  }
  let o_base = (seq * p.num_heads + head) * p.head_size;
  if (tid < p.head_size) { out[o_base + tid] = acc0 * inv_sum; }
  if (tid + WG < p.head_size) { out[o_base + tid + WG] = acc1 * inv_sum; }
}
