// attention/split_reduce.wgsl's combine for MANY partitions (fast_decode.reduce_spec: more than 8; one sequence of
// 131072 tokens has 60). Same partials, same result: partials[(seq, head, part)] = [m, l, acc[0..D)] in base 2,
//   M = max_p m_p;  L = sum_p l_p 2^(m_p - M);  out[d] = (sum_p acc_p[d] 2^(m_p - M)) / L   (0 when L = 0)
// a partition with l = 0 (no token) adding nothing. Why a second kernel: a loop naga bounds stays a loop and each
// step waits for its loads, so decode_reduce.wgsl's two loops over 60 partitions, 8 a step, wait for DRAM 16 times
// in a row (a large share of the decode at 1 x 131072 on the H200). Here GROUPS groups of LANES threads take the
// partitions interleaved (partition s0 + k * GROUPS + g to group g), CHUNK a step with every load of the step
// issued together and one online pass (each group's state rescaled when its max grows), and the groups meet once
// in workgroup memory: 60 partitions wait twice. For a few partitions decode_reduce.wgsl is faster (fewer threads
// and loads; both measured on the H200, docs/benchmarks.md) and stays. The sums run in a different order from it.
// Grid (num_heads, num_seqs, 1), GROUPS x LANES = 256 threads; lane `lane` of a group owns dims lane + LANES j.
@group(0) @binding(0) var<storage, read> partials: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
struct P { num_heads: u32, head_size: u32, num_partitions: u32 }
var<immediate> p: P;

const LANES: u32 = 64u;
const GROUPS: u32 = 4u;   // fast_decode.WIDE_REDUCE_GROUPS
const CHUNK: u32 = 8u;    // fast_decode.WIDE_REDUCE_CHUNK
const DIMS: u32 = 4u;     // 64 x 4 = 256, the largest head the fast decodes take
const NO_STATE: f32 = -3.0e38;   // m of a group that has seen no partition (finite: 2^(NO_STATE - M) is 0 or 1, never NaN)
var<workgroup> group_m: array<f32, GROUPS>;
var<workgroup> group_l: array<f32, GROUPS>;
var<workgroup> group_a: array<f32, GROUPS * DIMS * LANES>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let head = wid.x;
  let seq = wid.y;
  let D = p.head_size;
  let P = p.num_partitions;
  let stride = D + 2u;
  let base = (seq * p.num_heads + head) * P * stride;
  let g = t / LANES;
  let lane = t % LANES;
  // this group's partitions
  var m = NO_STATE;
  var l = 0.0;
  var a = array<f32, DIMS>(0.0, 0.0, 0.0, 0.0);
  for (var s0 = 0u; s0 < P; s0 = s0 + GROUPS * CHUNK) {
    var mc: array<f32, CHUNK>;
    var lc: array<f32, CHUNK>;
    var ac: array<f32, CHUNK * DIMS>;
    // @unroll
    for (var k = 0u; k < CHUNK; k = k + 1u) {
      let i = s0 + k * GROUPS + g;
      mc[k] = NO_STATE;
      lc[k] = 0.0;
      if (i < P) {
        let o = base + i * stride;
        mc[k] = partials[o];
        lc[k] = partials[o + 1u];
        // @unroll
        for (var j = 0u; j < DIMS; j = j + 1u) {
          let d = lane + LANES * j;
          ac[k * DIMS + j] = select(0.0, partials[o + 2u + min(d, D - 1u)], d < D);
        }
      }
    }
    var mn = m;
    // @unroll
    for (var k = 0u; k < CHUNK; k = k + 1u) {
      if (lc[k] > 0.0) { mn = max(mn, mc[k]); }
    }
    let f = exp2(m - mn);   // the running state rescaled to the step's max (1 when it did not grow)
    l = l * f;
    // @unroll
    for (var j = 0u; j < DIMS; j = j + 1u) { a[j] = a[j] * f; }
    // @unroll
    for (var k = 0u; k < CHUNK; k = k + 1u) {
      if (lc[k] > 0.0) {
        let e = exp2(mc[k] - mn);
        l = l + lc[k] * e;
        // @unroll
        for (var j = 0u; j < DIMS; j = j + 1u) { a[j] = a[j] + ac[k * DIMS + j] * e; }
      }
    }
    m = mn;
  }
  if (lane == 0u) {
    group_m[g] = m;
    group_l[g] = l;
  }
  // @unroll
  for (var j = 0u; j < DIMS; j = j + 1u) { group_a[(g * DIMS + j) * LANES + lane] = a[j]; }
  workgroupBarrier();
  // the groups' states combined by group 0
  if (g != 0u) { return; }
  var M = NO_STATE;
  // @unroll
  for (var h = 0u; h < GROUPS; h = h + 1u) {
    if (group_l[h] > 0.0) { M = max(M, group_m[h]); }
  }
  var L = 0.0;
  var y = array<f32, DIMS>(0.0, 0.0, 0.0, 0.0);
  // @unroll
  for (var h = 0u; h < GROUPS; h = h + 1u) {
    let lh = group_l[h];
    if (lh > 0.0) {
      let e = exp2(group_m[h] - M);
      L = L + lh * e;
      // @unroll
      for (var j = 0u; j < DIMS; j = j + 1u) { y[j] = y[j] + group_a[(h * DIMS + j) * LANES + lane] * e; }
    }
  }
  let inv = select(0.0, 1.0 / L, L > 0.0);
  let ob = (seq * p.num_heads + head) * D;
  // @unroll
  for (var j = 0u; j < DIMS; j = j + 1u) {
    let d = lane + LANES * j;
    if (d < D) { out[ob + d] = y[j] * inv; }
  }
}
