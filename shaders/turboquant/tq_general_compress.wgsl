// TurboQuant compressor at the paper's settings (arXiv:2504.19874; kvviz/families/turboquant/format.py, "general
// settings"): one INSTANCE (a set of n_ch channels of a head, rotated in R^P, P a power of two >= n_ch,
// at `bits` bits) of keys or values, written into a per-token record of a paged cache.
// The seed configuration keeps tq_compress.wgsl + flash_attention_tq.wgsl; this kernel serves every
// other bit width, the outlier-channel split and head sizes that are not 32/64/128 (80, 96, ..., 256).
//
// Per (row, kv head), 256 lanes, lane j < P holds rotated coordinate j:
//   x_j = src[chans[j]] for j < n_ch, 0 past it (zero padding to P);
//   n = |x| (256-lane tree); k = inv_sqrt_P / n; y = WHT((x * k) * s_polar)   (the RHT of x / n);
//   idx_j = number of codebook boundaries <= y_j;
//   keys: r = y - c[idx]; rn = |r|; JL bit j = WHT((r / rn) * s_jl)_j >= 0.
//   norm word = pack2x16float(n, rn) (values: (n, 0)); n < 1e-12: every word 0; rn < 1e-12: JL words 0.
// Codes: a bit stream of `bits`-bit indices, index j at bits j*bits.. (LSB first, across words).
// Arithmetic order is the oracle's (kvviz/families/turboquant/oracle.py `encode_general`).
//
// Bind group 0:
//   @binding(0) src:      array<f32>  rows x n_kv_heads x head_dim (K or V)
//   @binding(1) slots:    array<u32>  the rows' cache slots (PAD_SLOT: skipped)
//   @binding(2) chans:    array<u32>  this cache's channel table of K or V [kv_heads, head_dim]
//   @binding(3) signs:    array<f32>  [polar(P) | jl(P)] signs of this instance
//   @binding(4) codebook: array<f32>  [centroids(2^bits) | boundaries(2^bits - 1)] of this instance
//   @binding(5) params:   array<u32, 16>
//     (n_rows, n_kv_heads, head_dim, block_size, wpt, row_base, keys, n_ch, rot, bits, chan_off,
//      code_off, jl_off, norm_off, inv_sqrt_p_bits, unused)
//   @binding(6) cache:    array<u32>  (read_write) the paged cache [blocks, kv_heads, block_size, wpt]
// Dispatch: (rows in this dispatch, n_kv_heads, 1) workgroups of 256 threads (tq_general_compress) or of 64
// (tq_general_compress64, every instance's P <= 64: the same results, trees of zeros past P being exact);
// row = row_base + wid.x. The body is tq_general_compress_body.wgsl, pasted into both entry points.

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read> slots: array<u32>;
@group(0) @binding(2) var<storage, read> chans: array<u32>;
@group(0) @binding(3) var<storage, read> signs: array<f32>;
@group(0) @binding(4) var<storage, read> codebook: array<f32>;
@group(0) @binding(5) var<storage, read> params: array<u32, 16>;
@group(0) @binding(6) var<storage, read_write> cache: array<u32>;

const EPS: f32 = 1e-12;
const PAD_SLOT: u32 = 0xFFFFFFFFu;

var<workgroup> rot: array<f32, 256>;
var<workgroup> red: array<f32, 256>;
var<workgroup> qidx: array<u32, 256>;

@compute @workgroup_size(256, 1, 1)
fn tq_general_compress(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let lanes = 256u;
    // #include "turboquant/tq_general_compress_body.wgsl"
}

@compute @workgroup_size(64, 1, 1)
fn tq_general_compress64(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let lanes = 64u;
    // #include "turboquant/tq_general_compress_body.wgsl"
}
