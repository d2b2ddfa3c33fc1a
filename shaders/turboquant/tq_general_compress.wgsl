// TurboQuant compressor at the paper's settings (arXiv:2504.19874; kvviz/formats/turboquant.py, "general
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
// Arithmetic order is the oracle's (kvviz/oracles/turboquant.py `encode_general`).
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
// Dispatch: (rows in this dispatch, n_kv_heads, 1) workgroups of 256 threads; row = row_base + wid.x.

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
    let tid = lid.x;
    let n_rows = params[0];
    let n_kv_heads = params[1];
    let d = params[2];
    let bs = params[3];
    let wpt = params[4];
    let row = params[5] + wid.x;
    let h = wid.y;
    if row >= n_rows || h >= n_kv_heads {
        return;
    }
    let slot = slots[row];
    if slot == PAD_SLOT {
        return;
    }
    let keys = params[6] != 0u;
    let n_ch = params[7];
    let head_dim = params[8];           // P: the rotation size (wht.wgsl reads `head_dim`)
    let bits = params[9];
    let chan_off = params[10];
    let code_off = params[11];
    let jl_off = params[12];
    let norm_off = params[13];
    let inv_sqrt_p = bitcast<f32>(params[14]);
    let levels = 1u << bits;
    let rec = ((slot / bs) * n_kv_heads + h) * bs * wpt + (slot % bs) * wpt;
    let live = tid < head_dim;

    // ── 1. n = |x| over the instance's channels ──
    var x = 0.0;
    if tid < n_ch {
        x = src[(row * n_kv_heads + h) * d + chans[h * d + chan_off + tid]];
    }
    red[tid] = x * x;
    // #include "turboquant/tree_sum256.wgsl"
    let norm = sqrt(red[0]);
    let is_zero = norm < EPS;
    let k = inv_sqrt_p / select(norm, 1.0, is_zero);

    // ── 2. RHT of x / n in R^P ──
    if live {
        rot[tid] = (x * k) * signs[tid];
    }
    // #include "turboquant/wht.wgsl"

    // ── 3. index (boundaries <= y), residual, |r| ──
    var r = 0.0;
    if live {
        let y = rot[tid];
        var qi = 0u;
        for (var i = 0u; i + 1u < levels; i += 1u) {
            qi += select(0u, 1u, y >= codebook[levels + i]);
        }
        qidx[tid] = qi;
        r = y - codebook[qi];
        rot[tid] = r;
    }
    red[tid] = r * r;
    // #include "turboquant/tree_sum256.wgsl"
    let rnorm = select(0.0, sqrt(red[0]), keys);
    let no_residual = rnorm < EPS;
    let safe_rn = select(rnorm, 1.0, no_residual);

    // ── 4. the code words: word w holds bits [32w, 32w + 32) of the stream ──
    let code_words = (head_dim * bits + 31u) / 32u;
    if tid < code_words {
        var word = 0u;
        let lo = 32u * tid;
        for (var j = lo / bits; j < head_dim && j * bits < lo + 32u; j += 1u) {
            let pos = j * bits;
            if pos >= lo {
                word = word | (qidx[j] << (pos - lo));
            } else {
                word = word | (qidx[j] >> (lo - pos));
            }
        }
        cache[rec + code_off + tid] = select(word, 0u, is_zero);
    }

    // ── 5. keys: QJL signs of WHT((r / rn) * s_jl) ──
    if keys {
        if live {
            rot[tid] = (rot[tid] / safe_rn) * signs[head_dim + tid];
        }
        // #include "turboquant/wht.wgsl"
        if tid < head_dim / 32u {
            var w = 0u;
            for (var e = 0u; e < 32u; e += 1u) {
                if rot[tid * 32u + e] >= 0.0 {
                    w = w | (1u << e);
                }
            }
            cache[rec + jl_off + tid] = select(w, 0u, is_zero || no_residual);
        }
    }
    if tid == 0u {
        cache[rec + norm_off] = select(pack2x16float(vec2<f32>(norm, rnorm)), 0u, is_zero);
    }
}
