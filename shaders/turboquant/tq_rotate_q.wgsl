// TurboQuant query rotation for flash_attention_tq.wgsl (and tq_scores.wgsl):
//   q_rot = RHT_polar(q)            (q is not normalised: the estimator is linear in q)
//   q_jl  = RHT_jl(q_rot)           (the key residual lives in rotated space)
//   sum   = sum_j q_jl[j]           (turns the positive-bit sum into the signed one)
// Output buffer [q_rot | q_jl | sums] f32, region = q_cap * n_heads * head_dim:
//   q_rot at (row * n_heads + h) * head_dim + j, q_jl at region + same, sum at 2*region + row*n_heads + h.
//
// Arithmetic order (kvviz/families/turboquant/oracle.py `rotate_q_parts` follows it bit for bit):
//   q_rot = WHT(q * s_polar) * inv_sqrt_d; q_jl = WHT(q_rot * s_jl) * inv_sqrt_d;
//   sum = tree over 128 lanes (0 past head_dim), strides 64..1. inv_sqrt_d = f32(1/sqrt(d)) from the host.
//
// Barriers at entry-point scope only: the transform and the tree sum are included text (see tq_compress.wgsl).
//
// Bind group 0:
//   @binding(0) src:    array<f32>  rows x n_heads x head_dim (unrotated queries)
//   @binding(1) qrot:   array<f32>  (read_write) [q_rot | q_jl | sums]
//   @binding(2) signs:  array<f32>  all layers' [polar | jl] signs
//   @binding(3) params: array<u32, 16>
//     (n_rows, n_heads, head_dim, q_cap, sign_off, row_base, inv_sqrt_d_bits, unused x 9)
// Dispatch: (rows in this dispatch, n_heads, 1) workgroups of 128 threads; row = row_base + wid.x.

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> qrot: array<f32>;
@group(0) @binding(2) var<storage, read> signs: array<f32>;
@group(0) @binding(3) var<storage, read> params: array<u32, 16>;

var<workgroup> rot: array<f32, 128>;
var<workgroup> red: array<f32, 128>;

@compute @workgroup_size(128, 1, 1)
fn tq_rotate_q(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let tid = lid.x;
    let n_rows = params[0];
    let n_heads = params[1];
    let head_dim = params[2];
    let q_cap = params[3];
    let sign_off = params[4];
    let row = params[5] + wid.x;
    let h = wid.y;
    if row >= n_rows || h >= n_heads {
        return;
    }
    let inv_sqrt_d = bitcast<f32>(params[6]);
    let region = q_cap * n_heads * head_dim;
    let base = (row * n_heads + h) * head_dim;
    let live = tid < head_dim;

    if live {
        rot[tid] = src[base + tid] * signs[sign_off + tid];
    }
    // #include "turboquant/wht.wgsl"
    if live {
        let qr = rot[tid] * inv_sqrt_d;
        qrot[base + tid] = qr;
        rot[tid] = qr * signs[sign_off + head_dim + tid];
    }
    // #include "turboquant/wht.wgsl"
    var qj = 0.0;
    if live {
        qj = rot[tid] * inv_sqrt_d;
        qrot[region + base + tid] = qj;
    }
    red[tid] = qj;
    // #include "turboquant/tree_sum.wgsl"
    if tid == 0u {
        qrot[2u * region + row * n_heads + h] = red[0];
    }
}
