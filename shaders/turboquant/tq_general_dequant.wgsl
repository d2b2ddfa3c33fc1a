// TurboQuant at the paper's settings: dequantise the used blocks of a general-settings cache
// (tq_general_compress.wgsl) into an f32 paged cache, so the f32 paged decode and weights kernels attend
// over it. Keys become the vector whose dot product with any query IS the TurboQuant estimate
// (polar term + QJL correction; the estimator is linear in q), values the PolarQuant reconstruction:
//   y = c[idx];  keys: y += (rn * qjl_scale) * ((WHT(2*bit - 1) * inv_sqrt_P) * s_jl)
//   x = ((WHT(y) * inv_sqrt_P) * s_polar) * n, coordinates j < n_ch to the instance's channels.
// Arithmetic order is the oracle's (kvviz/formats/turboquant.py `dequantize_general`).
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
// Dispatch: (items, n_kv_heads, 2 = K|V) workgroups of 256 threads; a workgroup walks the block's
// block_size tokens and the record's instances.

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
    let tid = lid.x;
    let blk = items[wid.x].x;
    let h = wid.y;
    let which = wid.z;
    let n_kv_heads = params[0];
    let d = params[1];
    let bs = params[2];
    let wpt = select(params[4], params[3], which == 0u);
    let win0 = params[5];
    let chan_base = (which * n_kv_heads + h) * d;
    for (var o = 0u; o < bs; o += 1u) {
        let rec = ((blk * n_kv_heads + h) * bs + o) * wpt;
        let out_base = (((blk - win0) * n_kv_heads + h) * bs + o) * d;
        for (var i = 0u; i < 2u; i += 1u) {
            let pb = 8u + 12u * (2u * which + i);
            if params[pb + 10u] == 0u {
                break;
            }
            let n_ch = params[pb];
            let head_dim = params[pb + 1u];   // P (wht.wgsl reads `head_dim`)
            let bits = params[pb + 2u];
            let chan_off = params[pb + 3u];
            let sign_off = params[pb + 4u];
            let cb_off = params[pb + 5u];
            let code_off = params[pb + 6u];
            let jl_off = params[pb + 7u];
            let norm_off = params[pb + 8u];
            let inv_sqrt_p = bitcast<f32>(params[pb + 9u]);
            let qjl_scale = bitcast<f32>(params[pb + 11u]);
            let live = tid < head_dim;
            let nw = unpack2x16float(load_w(which, rec + norm_off));
            var y = 0.0;
            if live {
                let pos = tid * bits;
                let w = pos / 32u;
                let sh = pos % 32u;
                var code = load_w(which, rec + code_off + w) >> sh;
                if sh + bits > 32u {
                    code = code | (load_w(which, rec + code_off + w + 1u) << (32u - sh));
                }
                y = codebook[cb_off + (code & ((1u << bits) - 1u))];
            }
            if which == 0u {
                if live {
                    let bit = (load_w(which, rec + jl_off + tid / 32u) >> (tid % 32u)) & 1u;
                    rot[tid] = select(-1.0, 1.0, bit == 1u);
                }
                // #include "turboquant/wht.wgsl"
                if live {
                    let a = nw.y * qjl_scale;
                    y = y + a * ((rot[tid] * inv_sqrt_p) * signs[sign_off + head_dim + tid]);
                }
                workgroupBarrier();
            }
            if live {
                rot[tid] = y;
            }
            // #include "turboquant/wht.wgsl"
            if tid < n_ch {
                let v = ((rot[tid] * inv_sqrt_p) * signs[sign_off + tid]) * nw.x;
                let c = chans[chan_base + chan_off + tid];
                if which == 0u { k_out[out_base + c] = v; } else { v_out[out_base + c] = v; }
            }
            workgroupBarrier();
        }
    }
}
