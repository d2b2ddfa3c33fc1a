// Included text: the body of both tq_general_compress entry points (see tq_general_compress.wgsl); `lanes` is
// the entry point's workgroup size (256 or 64, >= the rotation size P).
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
    // #include "turboquant/tree_sum_lanes.wgsl"
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
    // #include "turboquant/tree_sum_lanes.wgsl"
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
