// Included text, not a function: the first steps of both tq_compress.wgsl entry points, pasted in by
// `// #include` so their barriers stay at entry-point scope (see tree_sum.wgsl). Reads the params,
// returns from workgroups past the rows, then
//   1. n = |x| (128-lane tree); k = inv_sqrt_d / n (1 for a zero vector);
//   2. rot = WHT((x * k) * s_polar), the RHT of x / n.
let tid = lid.x;
let n_rows = params[0];
let n_kv_heads = params[1];
let head_dim = params[2];
let cache_cap = params[3];
let dst_pos = params[4];
let sign_off = params[5];
let row = params[6] + wid.x;
let h = wid.y;
if row >= n_rows || h >= n_kv_heads {
    return;
}
let inv_sqrt_d = bitcast<f32>(params[7]);
let polar_words = head_dim / 16u;
let slot = h * cache_cap + dst_pos + row;
let live = tid < head_dim;

// ── 1. n = |x| ──
var x = 0.0;
if live {
    x = src[(row * n_kv_heads + h) * head_dim + tid];
}
red[tid] = x * x;
// #include "turboquant/tree_sum.wgsl"
let norm = sqrt(red[0]);
let is_zero = norm < EPS;
let k = inv_sqrt_d / select(norm, 1.0, is_zero);

// ── 2. RHT_polar(x / n) ──
if live {
    rot[tid] = (x * k) * signs[sign_off + tid];
}
// #include "turboquant/wht.wgsl"
