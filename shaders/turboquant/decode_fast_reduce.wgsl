// Combines the partitions of turboquant/decode_fast.wgsl (and of turboquant/decode_fast_paged.wgsl) and rotates the result back, once per output.
// partials[(wid.y, head, part)] = [m, l, acc[0..D)] in base 2, acc in the ROTATED space, to output row out_seq + wid.y
// (the per-sequence decode: one dispatch a sequence over its own buffer, wid.y = 0; the paged decode: one dispatch,
// grid (num_heads, num_seqs, 1), over the batch's partials [S, H, P, D+2], out_seq = 0); a partition
// without tokens (l = 0: never written, zero-filled) is skipped:
//   M = max m_p;  L = sum l_p 2^(m_p - M);  y[d] = (sum acc_p[d] 2^(m_p - M)) / L
//   out = RHT^-1(y) = WHT(y / sqrt(D)) * signs_polar   (the seed flash_attention_tq's epilogue, same order)
// 0 for a sequence without tokens. 128 threads (D <= 128); thread t owns dim t.
// The butterflies' barriers sit at entry-point scope (naga miscompiles a barrier reached through a call in a loop).
@group(0) @binding(0) var<storage, read> partials: array<f32>;
@group(0) @binding(1) var<storage, read> signs: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
struct P { num_heads: u32, head_size: u32, num_partitions: u32, sign_off: u32, out_seq: u32, inv_sqrt_d: f32 }
var<immediate> p: P;

var<workgroup> acc: array<f32, 128>;
const CHUNK: u32 = 8u;   // partitions a step (fast_decode.REDUCE_CHUNK, as attention/split_reduce.wgsl)

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let head = wid.x;
  let seq = p.out_seq + wid.y;
  let D = p.head_size;
  let stride = D + 2u;
  let base = (wid.y * p.num_heads + head) * p.num_partitions * stride;
  // the partitions CHUNK at a time, their loads issued together (attention/split_reduce.wgsl says why); an index past
  // the last partition reads the last one and adds nothing; the sums run in partition order
  let last = p.num_partitions - 1u;
  var m = -3.0e38;
  for (var i0 = 0u; i0 < p.num_partitions; i0 = i0 + CHUNK) {
    var mc: array<f32, CHUNK>;
    var lc: array<f32, CHUNK>;
    // @unroll
    for (var k = 0u; k < CHUNK; k = k + 1u) {
      let o = base + min(i0 + k, last) * stride;
      mc[k] = partials[o];
      lc[k] = partials[o + 1u];
    }
    // @unroll
    for (var k = 0u; k < CHUNK; k = k + 1u) {
      if (lc[k] > 0.0) { m = max(m, mc[k]); }
    }
  }
  var l = 0.0;
  var a = 0.0;
  let td = min(t, D - 1u);
  for (var i0 = 0u; i0 < p.num_partitions; i0 = i0 + CHUNK) {
    var e: array<f32, CHUNK>;
    var lc: array<f32, CHUNK>;
    var ac: array<f32, CHUNK>;
    // @unroll
    for (var k = 0u; k < CHUNK; k = k + 1u) {
      let o = base + min(i0 + k, last) * stride;
      e[k] = exp2(partials[o] - m);
      lc[k] = partials[o + 1u];
      ac[k] = partials[o + 2u + td];
    }
    // @unroll
    for (var k = 0u; k < CHUNK; k = k + 1u) {
      if (i0 + k < p.num_partitions && lc[k] > 0.0) {
        l = l + lc[k] * e[k];
        a = a + ac[k] * e[k];
      }
    }
  }
  let inv = select(0.0, 1.0 / l, l > 0.0);
  if (t < D) {
    acc[t] = a * inv * p.inv_sqrt_d;
  }
  var s = 1u;
  while (s < D) {
    workgroupBarrier();
    if (t < D / 2u) {
      let i = (t / s) * 2u * s + (t % s);
      let x = acc[i];
      let y = acc[i + s];
      acc[i] = x + y;
      acc[i + s] = x - y;
    }
    s = s * 2u;
  }
  workgroupBarrier();
  if (t < D) {
    out[(seq * p.num_heads + head) * D + t] = acc[t] * signs[p.sign_off + t];
  }
}
