// Combines the partitions of fast/decode_tq.wgsl (and of fast/decode_tq_paged.wgsl) and rotates the result back, once per output.
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

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let head = wid.x;
  let seq = p.out_seq + wid.y;
  let D = p.head_size;
  let stride = D + 2u;
  let base = (wid.y * p.num_heads + head) * p.num_partitions * stride;
  var m = -3.0e38;
  for (var i = 0u; i < p.num_partitions; i = i + 1u) {
    if (partials[base + i * stride + 1u] > 0.0) {
      m = max(m, partials[base + i * stride]);
    }
  }
  var l = 0.0;
  for (var i = 0u; i < p.num_partitions; i = i + 1u) {
    let li = partials[base + i * stride + 1u];
    if (li > 0.0) {
      l = l + li * exp2(partials[base + i * stride] - m);
    }
  }
  let inv = select(0.0, 1.0 / l, l > 0.0);
  if (t < D) {
    var a = 0.0;
    for (var i = 0u; i < p.num_partitions; i = i + 1u) {
      let o = base + i * stride;
      if (partials[o + 1u] > 0.0) {
        a = a + partials[o + 2u + t] * exp2(partials[o] - m);
      }
    }
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
