// Attention weights (or raw logits) over positions of the TurboQuant estimator that
// flash_attention_tq.wgsl uses, so the app can show what the seed kernel attends to.
//
// Score of timestep t, in the seed's arithmetic order:
//   polar_dot = sum_w sum_k q_rot[16w+k] * c[idx]          (per word, LSB first)
//   pos_sum   = sum_w sum_k q_jl[32w+k] * f32(bit)
//   score     = (polar_dot * norm + norm * rn * qjl_scale * (2 * pos_sum - sum q_jl)) * scale
// Weights: softmax over t in [0, min(start_pos + q + 1, max_seq)); positions past the window get 0.
// This kernel writes the scores (logits, already multiplied by `scale`; 0 past the window) and, per
// partition of PARTITION positions, (max, sum exp(score - max)) over the window to `stats`; for
// weights, softmax_partitioned.wgsl (normaliser 1: exp(score - M) / L, the seed's) runs next.
//
// One workgroup of 256 threads per (head, query, partition), so no invocation's loops grow with
// the context (software rasterisers bound them: kvviz/gpu/loop_budget.py). A thread only
// re-reads positions it wrote itself, so `out` needs no barrier between passes.
// Barriers at entry-point scope only.
//
// Bind group 0:
//   @binding(0) qrot:    array<f32>  [q_rot | q_jl | sums] from tq_rotate_q
//   @binding(1) k_cache: array<u32>  [polar | jl | norms]
//   @binding(2) out:     array<f32>  (read_write) [n_queries][n_heads][out_len]
//   @binding(3) params:  array<u32, 16>
//     (n_heads, n_kv_heads, head_dim, max_seq, start_pos, scale_bits, q_cap, out_len,
//      qjl_scale_bits, unused, c0_bits, c1_bits, c2_bits, c3_bits, q_base, cache_cap)
//   @binding(4) stats:   array<f32>  (read_write) [n_queries][n_heads][partitions][2]
// Dispatch: (n_heads, n_queries, ceil(out_len / PARTITION)) workgroups of 256 threads;
// query = q_base + workgroup_id.y.

@group(0) @binding(0) var<storage, read> qrot: array<f32>;
@group(0) @binding(1) var<storage, read> k_cache: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read> params: array<u32, 16>;
@group(0) @binding(4) var<storage, read_write> stats: array<f32>;

const WG: u32 = 256u;
const NEG_INF: f32 = -3.402823e+38;
const MAX_HEAD_DIM: u32 = 128u;
const PARTITION: u32 = 512u;

var<workgroup> q_rot_shared: array<f32, MAX_HEAD_DIM>;
var<workgroup> q_jl_shared: array<f32, MAX_HEAD_DIM>;
var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(256, 1, 1)
fn tq_scores(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) num_wg: vec3<u32>,
) {
    let head = wid.x;
    let tid = lid.x;
    let n_heads = params[0];
    let n_kv_heads = params[1];
    let head_dim = params[2];
    let max_seq = params[3];
    let start_pos = params[4];
    let scale = bitcast<f32>(params[5]);
    let q_cap = params[6];
    let out_len = params[7];
    let qjl_scale = bitcast<f32>(params[8]);
    var centroids: array<f32, 4> = array<f32, 4>(
        bitcast<f32>(params[10]),
        bitcast<f32>(params[11]),
        bitcast<f32>(params[12]),
        bitcast<f32>(params[13]),
    );
    let q_global = params[14] + wid.y;
    let cache_cap = params[15];

    let pos_q = start_pos + q_global;
    let seq_len = min(min(pos_q + 1u, max_seq), out_len);
    let kv_head = head / (n_heads / n_kv_heads);
    let q_region = q_cap * n_heads * head_dim;
    let q_offset = (q_global * n_heads + head) * head_dim;
    let q_jl_sum = qrot[2u * q_region + q_global * n_heads + head];
    let polar_words = head_dim / 16u;
    let jl_words = head_dim / 32u;
    let vecs = n_kv_heads * cache_cap;
    let k_jl_off = vecs * polar_words;
    let k_norm_off = k_jl_off + vecs * jl_words;
    let kv_slot_base = kv_head * cache_cap;
    let row = (q_global * n_heads + head) * out_len;

    if tid < head_dim {
        q_rot_shared[tid] = qrot[q_offset + tid];
        q_jl_shared[tid] = qrot[q_region + q_offset + tid];
    }
    workgroupBarrier();

    // ── scores of this partition's positions, per-thread max over the causal window ──
    let t_begin = wid.z * PARTITION;
    let t_end = min(t_begin + PARTITION, out_len);
    var m = NEG_INF;
    for (var t = t_begin + tid; t < t_end; t += WG) {
        var score = 0.0;
        if t < seq_len {
            let slot = kv_slot_base + t;
            let norms = unpack2x16float(k_cache[k_norm_off + slot]);
            let norm = norms.x;
            let residual_norm = norms.y;
            var polar_dot = 0.0;
            let polar_base = slot * polar_words;
            for (var w = 0u; w < polar_words; w += 1u) {
                let word = k_cache[polar_base + w];
                let d0 = w * 16u;
                for (var k = 0u; k < 16u; k += 1u) {
                    polar_dot += q_rot_shared[d0 + k] * centroids[(word >> (2u * k)) & 3u];
                }
            }
            var pos_sum = 0.0;
            let jl_base = k_jl_off + slot * jl_words;
            for (var w = 0u; w < jl_words; w += 1u) {
                let word = k_cache[jl_base + w];
                let d0 = w * 32u;
                for (var k = 0u; k < 32u; k += 1u) {
                    pos_sum += q_jl_shared[d0 + k] * f32((word >> k) & 1u);
                }
            }
            let signed_sum = 2.0 * pos_sum - q_jl_sum;
            let correction = norm * residual_norm * qjl_scale * signed_sum;
            score = (polar_dot * norm + correction) * scale;
            m = max(m, score);
        }
        out[row + t] = score;
    }
    red[tid] = m;
    workgroupBarrier();
    if tid < 128u { red[tid] = max(red[tid], red[tid + 128u]); }
    workgroupBarrier();
    if tid < 64u { red[tid] = max(red[tid], red[tid + 64u]); }
    workgroupBarrier();
    if tid < 32u { red[tid] = max(red[tid], red[tid + 32u]); }
    workgroupBarrier();
    if tid < 16u { red[tid] = max(red[tid], red[tid + 16u]); }
    workgroupBarrier();
    if tid < 8u { red[tid] = max(red[tid], red[tid + 8u]); }
    workgroupBarrier();
    if tid < 4u { red[tid] = max(red[tid], red[tid + 4u]); }
    workgroupBarrier();
    if tid < 2u { red[tid] = max(red[tid], red[tid + 2u]); }
    workgroupBarrier();
    if tid < 1u { red[tid] = max(red[tid], red[tid + 1u]); }
    workgroupBarrier();
    let part_max = red[0];
    workgroupBarrier();

    // ── this partition's sum of exp(score - max) over the causal window; (max, sum) to stats ──
    var s = 0.0;
    for (var t = t_begin + tid; t < min(t_end, seq_len); t += WG) {
        s += exp(out[row + t] - part_max);
    }
    red[tid] = s;
    workgroupBarrier();
    if tid < 128u { red[tid] += red[tid + 128u]; }
    workgroupBarrier();
    if tid < 64u { red[tid] += red[tid + 64u]; }
    workgroupBarrier();
    if tid < 32u { red[tid] += red[tid + 32u]; }
    workgroupBarrier();
    if tid < 16u { red[tid] += red[tid + 16u]; }
    workgroupBarrier();
    if tid < 8u { red[tid] += red[tid + 8u]; }
    workgroupBarrier();
    if tid < 4u { red[tid] += red[tid + 4u]; }
    workgroupBarrier();
    if tid < 2u { red[tid] += red[tid + 2u]; }
    workgroupBarrier();
    if tid < 1u { red[tid] += red[tid + 1u]; }
    workgroupBarrier();
    if tid == 0u {
        let sb = ((wid.y * n_heads + head) * num_wg.z + wid.z) * 2u;
        stats[sb] = part_max;
        stats[sb + 1u] = red[0];
    }
}
