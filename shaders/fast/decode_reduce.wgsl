// Combines the partitions of fast/decode_split.wgsl. partials[(seq, head, part)] = [m, l, acc[0..D)]
// in base 2 (m is a max of scale*log2(e)*q.k, l = sum 2^(s - m), acc = sum 2^(s - m) * v):
//   M = max_p m_p;  L = sum_p l_p 2^(m_p - M);  out[d] = (sum_p acc_p[d] 2^(m_p - M)) / L
// (0 for a sequence without tokens: every partition is empty, L = 0). No 1e-6 term: an exact softmax.
// Grid (num_heads, num_seqs, 1), 64 threads; thread t owns dims t, t + 64, ...
@group(0) @binding(0) var<storage, read> partials: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
struct P { num_heads: u32, head_size: u32, num_partitions: u32 }
var<immediate> p: P;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let head = wid.x;
  let seq = wid.y;
  let stride = p.head_size + 2u;
  let base = (seq * p.num_heads + head) * p.num_partitions * stride;
  var m = -3.0e38;
  for (var i = 0u; i < p.num_partitions; i = i + 1u) {
    m = max(m, partials[base + i * stride]);
  }
  var l = 0.0;
  for (var i = 0u; i < p.num_partitions; i = i + 1u) {
    l = l + partials[base + i * stride + 1u] * exp2(partials[base + i * stride] - m);
  }
  let inv = select(0.0, 1.0 / l, l > 0.0);
  let ob = (seq * p.num_heads + head) * p.head_size;
  for (var d = t; d < p.head_size; d = d + 64u) {
    var a = 0.0;
    for (var i = 0u; i < p.num_partitions; i = i + 1u) {
      a = a + partials[base + i * stride + 2u + d] * exp2(partials[base + i * stride] - m);
    }
    out[ob + d] = a * inv;
  }
}
