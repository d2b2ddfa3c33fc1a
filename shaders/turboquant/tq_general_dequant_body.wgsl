// Included text: the body of both tq_general_dequant entry points (see tq_general_dequant.wgsl).
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
