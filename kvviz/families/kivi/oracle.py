"""numpy oracle of the KIVI paged cache (method `kivi`; shaders quant/kivi_*.wgsl).

KIVI (arXiv:2402.02750): keys quantised per CHANNEL over groups of 32 consecutive tokens, values per
TOKEN, both asymmetric with 2^bits - 1 levels (the quantiser of kvviz/families/int4/oracle.py: scale =
(max-min)/L, zero = min, degenerate below a range of 2^-100), the most recent tokens in full precision.

Which tokens are quantised. For a sequence of length L and option `recent` R:
    n_q(L) = floor(max(L - R, 0) / 32) * 32
positions [0, n_q) are quantised (K and V), positions [n_q, L) stay float32 (the "residual"): the R
most recent tokens plus the 0..31 older ones that do not yet fill a key group. Key groups are
therefore always complete: group g covers positions [32g, 32g + 32) of its sequence.

Buffers (u32 words unless noted), KW = D*bits/32 code words a token, WS = D*bs/16 side words a block:
  K   [num_blocks, kv_heads, bs*KW + WS]: per (block, head) the bs tokens' code words (element
      (32/bits)*w + l of a token in bits l*bits of its word w), then WS words of the sequence's
      "side stream". The side stream of a sequence (per head) holds, for group g and channel c,
      word 2D*g + 2c = scale and 2D*g + 2c + 1 = zero (f32 bits); stream word o lives in the
      sequence's logical block o // WS (physical block from the block table), at offset o % WS.
      This is exactly 2 f32 per channel per 32 tokens for every block size (a group's side data
      spans 32/bs blocks when bs < 32, and a block holds bs/32 groups' side data when bs >= 32).
  V   [num_blocks, kv_heads, bs*(KW + 2)]: per token [codes KW | scale | zero].
  res [total_residual, 2 (K, V), kv_heads, D] float32: residual rows, sequence by sequence
      (res_off of a sequence = number of residual rows of the sequences before it).
Residual tokens keep zeroed code words in K and V (their paged slot exists; they would be quantised
in place once a later group completes).

The int8-query variant of the fast decode (kvviz/families/kivi/decode.py, qk="i8") has its own reference here:
requantize_query (the query's codes of one key group, bit for bit the kernel's) and attention_i8 / method_attention_i8
(the float64 attention over those codes).
"""
from __future__ import annotations

import numpy as np

from kvviz.attention.paged_oracle import through_f32_decode
from kvviz.attention.split_decode import LOG2E, f32_tolerance
from kvviz.families.int4.format import pack_codes
from kvviz.families.int4.oracle import asym_codes, asym_dequant, asym_params, tmax, tmin
from kvviz.families.kivi.format import GROUP, Plan, k_stride, kw, n_quantised, plan, ws  # noqa: F401 - the layout


def quantize_seq(k: np.ndarray, v: np.ndarray, bits: int, n_q: int) -> dict:
    """Dense sequence k, v [L, kvh, D] -> codes / scales / zeros of positions < n_q and residual rows."""
    levels = (1 << bits) - 1
    k = np.asarray(k, np.float32)
    v = np.asarray(v, np.float32)
    L, kvh, D = k.shape
    kg = k[:n_q].reshape(n_q // GROUP, GROUP, kvh, D)
    kmn, kmx = tmin(kg, axis=1), tmax(kg, axis=1)  # [ng, kvh, D]
    ks, _ = asym_params(kmn, kmx, levels)
    kc = asym_codes(kg, kmn[:, None], ks[:, None], levels).reshape(n_q, kvh, D)
    vq = v[:n_q]
    vmn, vmx = tmin(vq), tmax(vq)  # [n_q, kvh]
    vs, _ = asym_params(vmn, vmx, levels)
    vc = asym_codes(vq, vmn[..., None], vs[..., None], levels)
    return {
        "k_codes": kc, "k_scale": ks, "k_zero": kmn,
        "v_codes": vc, "v_scale": vs, "v_zero": vmn,
        "k_res": k[n_q:].copy(), "v_res": v[n_q:].copy(),
    }


def dequantize_seq(qs: dict, n_q: int) -> tuple[np.ndarray, np.ndarray]:
    """-> (K^, V^) [L, kvh, D] float32, as the dequantise kernel computes them (up to fma fusion)."""
    ng = n_q // GROUP
    kc = qs["k_codes"].reshape(ng, GROUP, *qs["k_codes"].shape[1:])
    kq = asym_dequant(kc, qs["k_scale"][:, None], qs["k_zero"][:, None]).reshape(qs["k_codes"].shape)
    vq = asym_dequant(qs["v_codes"], qs["v_scale"][..., None], qs["v_zero"][..., None])
    return np.concatenate([kq, qs["k_res"]]), np.concatenate([vq, qs["v_res"]])


def dense(batch, x: np.ndarray, s: int) -> np.ndarray:
    return np.asarray(x)[batch.token_rows(s)]


def write_buffers(batch, key, value, bits: int, recent: int) -> dict:
    """The exact word contents of the K, V and residual buffers after the writer, from zeroed buffers."""
    key = np.asarray(key, np.float32)
    kvh, D = key.shape[1], key.shape[2]
    bs = batch.block_size
    p = plan(batch.context_lens, recent)
    KW, WS = kw(D, bits), ws(D, bs)
    kbuf = np.zeros((batch.num_blocks, kvh, bs * KW + WS), np.uint32)
    vbuf = np.zeros((batch.num_blocks, kvh, bs, KW + 2), np.uint32)
    kcodes = np.zeros((batch.num_blocks, kvh, bs, KW), np.uint32)
    res = np.zeros((max(p.total_res, 1), 2, kvh, D), np.float32)
    per_seq = []
    for s in range(batch.num_seqs):
        L, nq = int(p.context_lens[s]), int(p.n_q[s])
        qs = quantize_seq(dense(batch, key, s), dense(batch, value, s), bits, nq)
        per_seq.append(qs)
        blocks = np.asarray(batch.seq_blocks[s], dtype=np.int64)
        pos = np.arange(nq)
        b, o = blocks[pos // bs], pos % bs
        kcw = pack_codes(qs["k_codes"], bits)  # [nq, kvh, KW]
        vcw = pack_codes(qs["v_codes"], bits)
        kcodes[b, :, o, :] = kcw
        vbuf[b, :, o, :KW] = vcw
        vbuf[b, :, o, KW] = qs["v_scale"].view(np.uint32)
        vbuf[b, :, o, KW + 1] = qs["v_zero"].view(np.uint32)
        # side stream: [ng, 2D] per head -> words o = 2D*g + 2c (+1)
        ng = nq // GROUP
        for h in range(kvh):
            stream = np.stack([qs["k_scale"][:, h], qs["k_zero"][:, h]], axis=-1).reshape(ng * 2 * D)
            words = np.ascontiguousarray(stream).view(np.uint32)
            idx = np.arange(ng * 2 * D)
            kbuf[blocks[idx // WS], h, bs * KW + idx % WS] = words
        r0, n = int(p.res_off[s]), L - nq
        res[r0 : r0 + n, 0] = qs["k_res"]
        res[r0 : r0 + n, 1] = qs["v_res"]
    kbuf[:, :, : bs * KW] = kcodes.reshape(batch.num_blocks, kvh, bs * KW)
    return {"k": kbuf, "v": vbuf.reshape(batch.num_blocks, kvh, bs * (KW + 2)), "res": res, "plan": p, "per_seq": per_seq}


def dequantize_cache(batch, key, value, bits: int, recent: int, per_seq=None):
    """Oracle f32 paged caches [num_blocks, kvh, bs, D] (K^, V^); slots of no sequence stay 0."""
    key = np.asarray(key, np.float32)
    kvh, D = key.shape[1], key.shape[2]
    bs = batch.block_size
    p = plan(batch.context_lens, recent)
    kc = np.zeros((batch.num_blocks, kvh, bs, D), np.float32)
    vc = np.zeros_like(kc)
    for s in range(batch.num_seqs):
        L, nq = int(p.context_lens[s]), int(p.n_q[s])
        qs = per_seq[s] if per_seq is not None else quantize_seq(dense(batch, key, s), dense(batch, value, s), bits, nq)
        kd, vd = dequantize_seq(qs, nq)
        blocks = np.asarray(batch.seq_blocks[s], dtype=np.int64)
        pos = np.arange(L)
        kc[blocks[pos // bs], :, pos % bs] = kd
        vc[blocks[pos // bs], :, pos % bs] = vd
    return kc, vc


def pad_head(key: np.ndarray, value: np.ndarray, q: np.ndarray | None = None):
    """KIVI at a head size that is not a multiple of 16: K padded with zero channels, V with channel 0
    repeated (the token's min / max unchanged), q with zeros, to the next multiple of 16."""
    D = key.shape[-1]
    extra = -(-D // 16) * 16 - D
    if not extra:
        return key, value, q
    k = np.concatenate([key, np.zeros(key.shape[:-1] + (extra,), np.float32)], -1)
    v = np.concatenate([value, np.repeat(value[..., :1], extra, -1)], -1)
    qp = None if q is None else np.concatenate([q, np.zeros(q.shape[:-1] + (extra,), np.float32)], -1)
    return k, v, qp


def method_attention(method, batch, key, value, q, scale, qkv=None):
    """End-to-end reference of `kivi` at any head size (padded as the method runs it, see pad_head): the
    oracle's dequantised caches through the f32 paged decode's arithmetic; tolerance 2e-5 * max(1, max|V^|)."""
    D = np.asarray(key).shape[-1]
    k, v, qp = pad_head(np.asarray(key, np.float32), np.asarray(value, np.float32), np.asarray(q, np.float32))
    ref = write_buffers(batch, k, v, method.bits, method.recent)
    fk, fv = dequantize_cache(batch, k, v, method.bits, method.recent, ref["per_seq"])
    out, tol = through_f32_decode(batch, qp, scale, fk.astype(np.float64), fv.astype(np.float64))
    return out[..., :D], tol




# ------------------------------------------------------------------------------------------- the int8 query
QI8_MAX = 127  # the query codes' range: -127..127 (symmetric)
QI8_MIN_EXPONENT = 8  # m below 2^-119 (f32 exponent field < 8) gives all-zero codes (shaders/kivi/query_i8.wgsl says why)


def query_prescale(q: np.ndarray, scale: float) -> np.ndarray:
    """q [..., D] -> q * (scale * log2 e) in float32, as the kernel pre-scales its query (split_macros' query_line: the
    immediate scale_log2 = f32(scale * log2 e), one f32 multiply)."""
    return (np.asarray(q, np.float32) * np.float32(float(scale) * LOG2E)).astype(np.float32)


def requantize_query(qk: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The int8 query of one key group (shaders/kivi/query_i8.wgsl, bit for bit): qk [..., D] float32 (the pre-scaled
    query times the group's K scales, one f32 multiply a channel) -> (codes int8 [..., D], factor f32 [...], step f32
    [...]). m = max_c |qk_c| = f * 2^k with f in [0.5, 1) (k from m's exponent field e: k = e - 126); factor 2^(7-k) and
    step 2^(k-7) are powers of two, so qk * factor is exact and the codes rint(qk * factor) (round half to even, as
    WGSL's round) clamped to [-127, 127] are the kernel's exactly. e < 8 (m < 2^-119: tiny, subnormal, zero): codes 0,
    factor and step 0. e = 255 (m infinite or NaN): codes 0 (the kernel's are unspecified there), factor 0, step NaN
    (the kernel's logits are NaN there)."""
    qk = np.asarray(qk, np.float32)
    m = np.abs(qk).max(axis=-1, initial=np.float32(0))
    e = ((m.view(np.uint32) >> 23) & 0xFF).astype(np.int64)
    ok = (e >= QI8_MIN_EXPONENT) & (e < 255)
    factor = np.where(ok, ((260 - e) << 23).astype(np.uint32).view(np.float32), np.float32(0)).astype(np.float32)
    step = np.where(ok, ((np.maximum(e, 6) - 6) << 23).astype(np.uint32).view(np.float32), np.float32(0))
    step = np.where(e == 255, np.float32(np.nan), step).astype(np.float32)
    with np.errstate(invalid="ignore"):
        x = (qk * factor[..., None]).astype(np.float32)  # exact: a power of two, no overflow (|x| < 128)
        codes = np.clip(np.rint(np.where(ok[..., None], x, np.float32(0))), -QI8_MAX, QI8_MAX).astype(np.int8)
    return codes, factor, step


def attention_i8(q: np.ndarray, scale: float, per_seq: list, num_kv_heads: int) -> np.ndarray:
    """The fast decode's int8-query variant in float64, sequence by sequence: q [S, H, D] (the head size the cache was
    written at), per_seq[s] quantize_seq's fields of sequence s (its n_q = len(k_codes)). With q2 = query_prescale(q)
    (base-2 logits), for key group g of KV head h: the codes and step of requantize_query(q2 * s_g) (float32, as the
    kernel makes them), logit = step * (codes . K codes) + q2 . z_g (the K zeros' bias with the f32 query, as the kernel
    keeps it); a residual token's logit q2 . k; softmax in base 2, P.V over the dequantised values (dequantize_seq).
    An empty sequence gives 0. -> [S, H, D] float64."""
    q = np.asarray(q, np.float32)
    S, H, D = q.shape
    G = H // num_kv_heads
    q2 = query_prescale(q, scale)
    out = np.zeros((S, H, D), np.float64)
    for s in range(S):
        qs = per_seq[s]
        nq = len(qs["k_codes"])
        _, vhat = dequantize_seq(qs, nq)
        if not len(vhat):
            continue
        ng = nq // GROUP
        for h in range(num_kv_heads):
            qh = q2[s, h * G : (h + 1) * G]  # [G, D]
            logits = []
            if ng:
                qk = (qh[None] * qs["k_scale"][:, h][:, None]).astype(np.float32)  # [ng, G, D]
                codes, _, step = requantize_query(qk)
                kc = qs["k_codes"][:, h].reshape(ng, GROUP, D).astype(np.float64)  # [ng, 32, D]
                dots = np.einsum("ngd,ntd->ngt", codes.astype(np.float64), kc)  # exact integers
                bias = np.einsum("gd,nd->ng", qh.astype(np.float64), qs["k_zero"][:, h].astype(np.float64))
                lg = dots * step.astype(np.float64)[..., None] + bias[..., None]  # [ng, G, 32]
                logits.append(lg.transpose(1, 0, 2).reshape(G, nq))
            logits.append(qh.astype(np.float64) @ qs["k_res"][:, h].astype(np.float64).T)  # [G, L - nq]
            lg = np.concatenate(logits, axis=1)
            w = np.exp2(lg - lg.max(axis=1, keepdims=True))
            out[s, h * G : (h + 1) * G] = (w @ vhat[:, h].astype(np.float64)) / w.sum(axis=1, keepdims=True)
    return out


def method_attention_i8(method, batch, key, value, q, scale, qkv=None):
    """End-to-end reference of `kivi`'s fast decode with the int8 query (qk="i8") at any head size (padded as the method
    runs it, pad_head): attention_i8 over the oracle's own quantisation (write_buffers), tolerance the f32 kernel's,
    2e-5 * max(1, max |V^|) (kvviz/families/kivi/decode.py says why it holds)."""
    D = np.asarray(key).shape[-1]
    k, v, qp = pad_head(np.asarray(key, np.float32), np.asarray(value, np.float32), np.asarray(q, np.float32))
    ref = write_buffers(batch, k, v, method.bits, method.recent)
    out = attention_i8(qp, scale, ref["per_seq"], k.shape[1])
    vmax = max((float(np.abs(dequantize_seq(qs, len(qs["k_codes"]))[1]).max(initial=0.0)) for qs in ref["per_seq"]),
               default=0.0)
    return out[..., :D], f32_tolerance(vmax)
