// TurboQuant compressor (arXiv:2504.19874): writes one sequence's keys and values into the
// compressed cache that the seed `flash_attention_tq.wgsl` reads.
//
// Keys (tq_compress_keys), per (row, kv_head):
//   n = |k|; y = RHT_polar(k / n); idx = 2-bit Lloyd-Max index of each y[j];
//   r = y - c[idx]; rn = |r|; JL bit j = WHT((r / rn) * s_jl)[j] >= 0;
//   norm word = pack2x16float(n, rn). n < 1e-12: every word 0; rn < 1e-12: JL words 0.
// Values (tq_compress_values): the polar part and pack2x16float(n, 0).
//
// Arithmetic order (kvviz/families/turboquant/oracle.py follows it bit for bit):
//   sum of squares: lane j holds x[j]*x[j] (0 past head_dim), tree over 128 lanes, strides 64..1;
//   n = sqrt(sum); k = inv_sqrt_d / n (inv_sqrt_d = f32(1/sqrt(d)) from the host);
//   u[j] = (x[j] * k) * s[j]; WHT butterflies (a+b, a-b) at strides 1, 2, 4, ... -> y.
//   Folding 1/n and 1/sqrt(d) into one factor is the same RHT, with one rounding instead of two.
//   The residual's sum of squares uses the same tree; the JL input is (r[j] / rn) * s_jl[j];
//   only the signs of the (unnormalised) second WHT are kept.
//
// Layout (u32 words; vecs = n_kv_heads * cache_cap, slot = kv_head * cache_cap + t):
//   keys   [polar | jl | norms]: polar word slot*d/16 + w (element j at bits 2j, LSB first);
//          jl at vecs*d/16 + slot*d/32 + w (element j at bit j); norms at vecs*d/16 + vecs*d/32 + slot.
//   values [polar | norms]: norms at vecs*d/16 + slot.
//
// All barriers sit at entry-point scope and in uniform control flow (naga's SPIR-V output
// miscompiles workgroupBarrier() reached through a function call inside a loop): the shared steps
// with barriers (the tree sum, the Walsh-Hadamard transform, the load-normalise-rotate prologue) are
// text pasted into each entry point by `// #include`; barrier-free helpers are functions. Workgroup
// memory is not zero-initialised: every lane writes its slot before any lane reads it.
//
// Bind group 0:
//   @binding(0) src:    array<f32>  rows x n_kv_heads x head_dim
//   @binding(1) cache:  array<u32>  (read_write) the K or V cache
//   @binding(2) signs:  array<f32>  all layers' [polar | jl] signs
//   @binding(3) params: array<u32, 16>
//     (n_rows, n_kv_heads, head_dim, cache_cap, dst_pos, sign_off, row_base, inv_sqrt_d_bits,
//      c0_bits, c1_bits, c2_bits, c3_bits, b0_bits, b1_bits, b2_bits, unused)
// Dispatch: (rows in this dispatch, n_kv_heads, 1) workgroups of 128 threads; source row =
// row_base + workgroup_id.x, cache position = dst_pos + source row.

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> cache: array<u32>;
@group(0) @binding(2) var<storage, read> signs: array<f32>;
@group(0) @binding(3) var<storage, read> params: array<u32, 16>;

const WG: u32 = 128u;
const EPS: f32 = 1e-12;

var<workgroup> rot: array<f32, 128>;
var<workgroup> red: array<f32, 128>;
var<workgroup> qidx: array<u32, 128>;

fn centroid(i: u32) -> f32 {
    var c: array<f32, 4> = array<f32, 4>(
        bitcast<f32>(params[8]),
        bitcast<f32>(params[9]),
        bitcast<f32>(params[10]),
        bitcast<f32>(params[11]),
    );
    return c[i];
}

fn quantize(v: f32) -> u32 {
    let b0 = bitcast<f32>(params[12]);
    let b1 = bitcast<f32>(params[13]);
    let b2 = bitcast<f32>(params[14]);
    if v < b1 {
        if v < b0 { return 0u; }
        return 1u;
    }
    if v < b2 { return 2u; }
    return 3u;
}

// Polar word w: indices qidx[16w .. 16w + 15], element e at bits 2e (LSB first).
fn polar_word(w: u32) -> u32 {
    var word = 0u;
    for (var e = 0u; e < 16u; e += 1u) {
        word = word | (qidx[w * 16u + e] << (2u * e));
    }
    return word;
}

@compute @workgroup_size(128, 1, 1)
fn tq_compress_keys(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    // #include "turboquant/compress_rotate.wgsl"
    let jl_words = head_dim / 32u;
    let vecs = n_kv_heads * cache_cap;
    let jl_off = vecs * polar_words;
    let norm_off = jl_off + vecs * jl_words;

    // ── 3. index, residual, |r| (every lane read red[0] above, before the barriers) ──
    var r = 0.0;
    if live {
        let y = rot[tid];
        let qi = quantize(y);
        qidx[tid] = qi;
        r = y - centroid(qi);
        rot[tid] = r;
    }
    red[tid] = r * r;
    // #include "turboquant/tree_sum.wgsl"
    let rnorm = sqrt(red[0]);
    let no_residual = rnorm < EPS;
    let safe_rn = select(rnorm, 1.0, no_residual);

    if tid < polar_words {
        cache[slot * polar_words + tid] = select(polar_word(tid), 0u, is_zero);
    }

    // ── 4. QJL: signs of WHT((r / rn) * s_jl) ──
    if live {
        rot[tid] = (rot[tid] / safe_rn) * signs[sign_off + head_dim + tid];
    }
    // #include "turboquant/wht.wgsl"
    if tid < jl_words {
        var w = 0u;
        for (var e = 0u; e < 32u; e += 1u) {
            if rot[tid * 32u + e] >= 0.0 {
                w = w | (1u << e);
            }
        }
        cache[jl_off + slot * jl_words + tid] = select(w, 0u, is_zero || no_residual);
    }
    if tid == 0u {
        cache[norm_off + slot] = select(pack2x16float(vec2<f32>(norm, rnorm)), 0u, is_zero);
    }
}

@compute @workgroup_size(128, 1, 1)
fn tq_compress_values(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    // #include "turboquant/compress_rotate.wgsl"
    let norm_off = n_kv_heads * cache_cap * polar_words;

    if live {
        qidx[tid] = quantize(rot[tid]);
    }
    workgroupBarrier();
    if tid < polar_words {
        cache[slot * polar_words + tid] = select(polar_word(tid), 0u, is_zero);
    }
    if tid == 0u {
        cache[norm_off + slot] = select(pack2x16float(vec2<f32>(norm, 0.0)), 0u, is_zero);
    }
}
