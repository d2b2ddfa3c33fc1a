// TurboQuant at the paper's settings: dequantise the used blocks of a general-settings cache
// (tq_general_compress.wgsl) into an f32 paged cache, so the f32 paged decode and weights kernels attend
// over it. Keys become the vector whose dot product with any query IS the TurboQuant estimate
// (polar term + QJL correction; the estimator is linear in q), values the PolarQuant reconstruction:
//   y = c[idx];  keys: y += (rn * qjl_scale) * ((WHT(2*bit - 1) * inv_sqrt_P) * s_jl)
//   x = ((WHT(y) * inv_sqrt_P) * s_polar) * n, coordinates j < n_ch to the instance's channels.
// Arithmetic order is the oracle's (kvviz/families/turboquant/format.py `dequantize_general`).
//
// Bind group 0:
//   @binding(0) k_cache:  array<u32>  [blocks, kv_heads, block_size, wpt_k]
//   @binding(1) v_cache:  array<u32>  [blocks, kv_heads, block_size, wpt_v]
//   @binding(2) chans:    array<u32>  [2 (K, V), kv_heads, head_dim] channel tables
//   @binding(3) signs:    array<f32>  every instance's [polar(P) | jl(P)] at its sign_off
//   @binding(4) codebook: array<f32>  every instance's [centroids | boundaries] at its cb_off
//   @binding(5) params:   array<u32, 64>
//     0..7: n_kv_heads, head_dim, block_size, wpt_k, wpt_v, win0, unused, unused;
//     then 4 instance slots (K0, K1, V0, V1) of 12 words at 8 + 12 * (2 * which + i):
//     (n_ch, rot, bits, chan_off, sign_off, cb_off, code_off, jl_off, norm_off, inv_sqrt_p_bits, used,
//      qjl_scale_bits: the instance's QJL scale, sqrt(pi/2)/P or sqrt(pi/2)/sqrt(P))
//   @binding(6) items:    array<vec4<u32>>  (physical block, ...) work items
//   @binding(7) k_out, @binding(8) v_out: array<f32> (read_write) the f32 cache window from block win0
// Dispatch: (items, n_kv_heads, 2 = K|V) workgroups of 256 threads (tq_general_dequant) or 64 (tq_general_dequant64,
// every instance's P <= 64); a workgroup walks the block's block_size tokens and the record's instances. The body is
// tq_general_dequant_body.wgsl, pasted into both entry points.

@group(0) @binding(0) var<storage, read> k_cache: array<u32>;
@group(0) @binding(1) var<storage, read> v_cache: array<u32>;
@group(0) @binding(2) var<storage, read> chans: array<u32>;
@group(0) @binding(3) var<storage, read> signs: array<f32>;
@group(0) @binding(4) var<storage, read> codebook: array<f32>;
@group(0) @binding(5) var<storage, read> params: array<u32, 64>;
@group(0) @binding(6) var<storage, read> items: array<vec4<u32>>;
@group(0) @binding(7) var<storage, read_write> k_out: array<f32>;
@group(0) @binding(8) var<storage, read_write> v_out: array<f32>;

var<workgroup> rot: array<f32, 256>;

fn load_w(which: u32, i: u32) -> u32 { if (which == 0u) { return k_cache[i]; } return v_cache[i]; }

@compute @workgroup_size(256, 1, 1)
fn tq_general_dequant(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    // #include "turboquant/tq_general_dequant_body.wgsl"
}

@compute @workgroup_size(64, 1, 1)
fn tq_general_dequant64(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    // #include "turboquant/tq_general_dequant_body.wgsl"
}
