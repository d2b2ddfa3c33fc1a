// Combines the partitions of attention/split_decode.wgsl. partials[(seq, head, part)] = [m, l, acc[0..D)]
// in base 2 (m is a max of scale*log2(e)*q.k, l = sum 2^(s - m), acc = sum 2^(s - m) * v):
//   M = max_p m_p;  L = sum_p l_p 2^(m_p - M);  out[d] = (sum_p acc_p[d] 2^(m_p - M)) / L
// (0 for a sequence without tokens: every partition is empty, L = 0). No 1e-6 term: an exact softmax.
// Grid (num_heads, num_seqs, 1), 64 threads; thread t owns dims t, t + 64, t + 128, t + 192 (D <= 256).
// Why it is laid out so: a loop naga bounds stays a loop, so a loop of one partition a step waits for each
// step's loads in turn (three such loops are a measurable share of the decode at the anchor shape, 4 partitions).
// Here the partitions go CHUNK at a time, their loads issued together (an index past the last partition reads
// the last one and adds 0), and the two passes (M, then L and the dims together) wait twice for P <= CHUNK. The
// sums run in partition order.
@group(0) @binding(0) var<storage, read> partials: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
struct P { num_heads: u32, head_size: u32, num_partitions: u32 }
var<immediate> p: P;

const CHUNK: u32 = 8u;
const DIMS: u32 = 4u;   // dims a thread: 64 x 4 = 256, the largest head the fast decodes take

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let head = wid.x;
  let seq = wid.y;
  let stride = p.head_size + 2u;
  let base = (seq * p.num_heads + head) * p.num_partitions * stride;
  let last = p.num_partitions - 1u;
  var m = -3.0e38;
  for (var i0 = 0u; i0 < p.num_partitions; i0 = i0 + CHUNK) {
    var mc: array<f32, CHUNK>;
    // @unroll
    for (var k = 0u; k < CHUNK; k = k + 1u) { mc[k] = partials[base + min(i0 + k, last) * stride]; }
    // @unroll
    for (var k = 0u; k < CHUNK; k = k + 1u) { m = max(m, mc[k]); }   // a repeated last partition: max is unchanged
  }
  var l = 0.0;
  var a = array<f32, DIMS>(0.0, 0.0, 0.0, 0.0);
  for (var i0 = 0u; i0 < p.num_partitions; i0 = i0 + CHUNK) {
    var e: array<f32, CHUNK>;
    var lc: array<f32, CHUNK>;
    var ac: array<f32, CHUNK * DIMS>;
    // @unroll
    for (var k = 0u; k < CHUNK; k = k + 1u) {
      let o = base + min(i0 + k, last) * stride;
      e[k] = exp2(partials[o] - m);
      lc[k] = partials[o + 1u];
      // @unroll
      for (var j = 0u; j < DIMS; j = j + 1u) { ac[k * DIMS + j] = partials[o + 2u + min(t + 64u * j, p.head_size - 1u)]; }
    }
    // @unroll
    for (var k = 0u; k < CHUNK; k = k + 1u) {
      if (i0 + k < p.num_partitions) {
        l = l + lc[k] * e[k];
        // @unroll
        for (var j = 0u; j < DIMS; j = j + 1u) { a[j] = a[j] + ac[k * DIMS + j] * e[k]; }
      }
    }
  }
  let inv = select(0.0, 1.0 / l, l > 0.0);
  let ob = (seq * p.num_heads + head) * p.head_size;
  // @unroll
  for (var j = 0u; j < DIMS; j = j + 1u) {
    let d = t + 64u * j;
    if (d < p.head_size) { out[ob + d] = a[j] * inv; }
  }
}
