// ---- shaders/attention/split_fold.wgsl: the folded reduce of a paged split-K decode (kvviz/attention/split_decode.py
// fold_defines puts it into a split kernel as FOLD_DECLS, and FOLD calls it after the partials' write). The workgroups
// of one (sequence, KV head) count themselves on counters[seq * num_kv_heads + kvh] as each finishes its partials; the
// last one combines the partitions of its G query heads as attention/split_reduce.wgsl does, in the same dispatch,
// and resets the counter to 0 for the next run. storageBarrier() is naga's device-scope barrier over storage memory:
// before the count it makes this workgroup's partials visible to the last workgroup, after the count (in the last
// workgroup) it acquires the others'. Every workgroup of the grid reaches the count (no early return in a split
// kernel), so the last one always comes.
@group(0) @binding({{COUNTER_BINDING}}) var<storage, read_write> counters: array<atomic<u32>>;
@group(0) @binding({{OUT_BINDING}}) var<storage, read_write> out: array<f32>;
var<workgroup> fold_last: u32;

fn fold_partitions(seq: u32, kvh: u32, li: u32) {
  storageBarrier();
  let c = seq * p.num_kv_heads + kvh;
  if (li == 0u) {
    fold_last = select(0u, 1u, atomicAdd(&counters[c], 1u) + 1u == p.num_partitions);
  }
  if (workgroupUniformLoad(&fold_last) == 0u) {
    return;
  }
  storageBarrier();
  if (li == 0u) {
    atomicStore(&counters[c], 0u);
  }
  // the G heads' D dims over the workgroup's threads; each combines its dim's partitions in partition order
  // (M = max m, L = sum l 2^(m - M), out = sum acc 2^(m - M) / L; 0 for a sequence without tokens)
  let hb = seq * p.num_heads + kvh * {{G}}u;
  for (var i = li; i < {{G}}u * D; i = i + {{WG}}u) {
    let base = (hb + i / D) * p.num_partitions * STRIDE;
    let d = i % D;
    var m = -3.0e38;
    for (var k = 0u; k < p.num_partitions; k = k + 1u) {
      m = max(m, partials[base + k * STRIDE]);
    }
    var l = 0.0;
    var a = 0.0;
    for (var k = 0u; k < p.num_partitions; k = k + 1u) {
      let o = base + k * STRIDE;
      let e = exp2(partials[o] - m);
      l = l + partials[o + 1u] * e;
      a = a + partials[o + 2u + d] * e;
    }
    out[(hb + i / D) * D + d] = a * select(0.0, 1.0 / l, l > 0.0);
  }
}
// ---- end of split_fold.wgsl
