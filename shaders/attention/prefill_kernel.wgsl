// ---- shaders/attention/prefill_kernel.wgsl: the causal (chunked) prefill attention over a paged cache, the one kernel
// every cache format's prefill shell includes (attention/prefill.wgsl, ggml/prefill.wgsl, fp4/prefill.wgsl,
// kivi/prefill.wgsl, turboquant/prefill.wgsl). kvviz/attention/prefill.py plans it and renders its sizes.
//
// A shell defines, before or after this include (WGSL module scope is order-free):
//   fn load_k4(t: TokenAt, c: u32) -> vec4<f32>   dims 4c..4c+3 of the token's K, dequantised (scales applied)
//   fn load_v4(t: TokenAt, c: u32) -> vec4<f32>   the same of V
// and its extra bindings from @binding(6) on. The defines K_TILE / V_TILE (empty for most formats) are code the
// kernel runs, in every invocation, after a K / V tile sits in kvs (`tile`: TileAt): a format that finishes its
// values in workgroup memory (TurboQuant's inverse rotations) does it there. They are pasted into the entry point,
// not called: naga's SPIR-V miscompiles a barrier reached through a function call inside a loop (docs/kernels.md,
// "TurboQuant").
//
// Grid (query tiles, num_kv_heads, partitions). A query tile is BQ consecutive query positions of one sequence
// (tiles[x] = (sequence, first query row of q, its position, queries in the tile)); its R = BQ * G rows are the
// (query, head) pairs of the G query heads of one KV head, so every K/V value loaded is shared by the G heads
// (GQA) and by the BQ queries. A partition is partition_tokens consecutive key positions; the keys a tile reads
// are those of its partition before its last query's position (causal), BK at a time. Two ways to run a tile's
// online softmax (base 2), chosen by SPREAD:
// SPREAD (every invocation, from the scores it holds in registers):
//   K tile -> kvs (dequantised by load_k4, f32)                                      barrier
//   S = Q K^T (pre-scaled by scale * log2 e), soft-capped, masked, in registers; each invocation's max of its keys
//   of each of its rows -> rowstat[row, ct]                                                     barrier
//   each invocation: a row's max = the max of its CT partial maxima (the same in every invocation of the row),
//   alpha = 2^(m_old - m), p = 2^(s - m) of its own scores -> ps, its own partial sum l, O *= alpha; V tile -> kvs
//                                                                                    barrier
//   O += P V                                                                         barrier
//   at the end a row's l is the sum of its CT invocations' partial sums (through rowstat).
// not SPREAD (one invocation a row, over the tile's scores in workgroup memory):
//   K tile -> kvs                                            barrier
//   S = Q K^T -> ps, soft-capped, masked                     barrier
//   rows r < R: online softmax of row r (m, l; alpha, p = 2^(s - m) in place); V tile -> kvs   barrier
//   O = O * alpha + P V                                      barrier
// There the R invocations of the softmax walk BK scores twice while the others wait at the barrier; SPREAD spreads
// that work over every invocation and keeps the scores in registers.
// Thread (rt, ct) of RT x CT owns rows rt*TM .. rt*TM+TM-1: in S the keys ct + CT n (n < TN), in O the vec4s of
// dims ct + CT n (n < ND4). SV4: S accumulates a vec4 of partial products a score (four independent FMAs a step,
// summed once a tile) instead of a dot() a step (a multiply, three dependent FMAs and an add). Row strides are
// padded by one vec4 / one float (QST, PST) so a warp's reads of consecutive rows fall in distinct banks. Loops
// over the head's dims and the tile's keys stay loops: the shader's size does not grow with the head size (only
// the TM x TN and TM x ND4 register tiles, and the CT partial maxima of a row, are unrolled).
// Soft-capping (Gemma 2's attention logits: s -> cap * tanh(s / cap) after the query scale, before the mask and
// the softmax): p.cap_log2 = cap * log2 e, since in base 2 the capped score is (cap log2 e) tanh(x / (cap log2 e)) of
// the pre-scaled x = s log2 e; 0 leaves the scores as they are (one uniform branch, no pipeline of its own). tanh's
// argument is clamped to [-15, 15] (tanh is 1 in f32 from 9.02 on), as the forward's attention clamps it, so a
// driver's exp-based tanh cannot overflow.
// Output: with one partition, out[(query row * num_heads + head) * D + d] = O / l (exact softmax); with more,
// partials [query row, head, partition, D + 2] = (m, l, O) in base 2 for attention/split_reduce*.wgsl
// (grid (num_heads, query rows)). A row whose partition holds none of its keys writes m = LOWEST, l = 0.
@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<u32>;
@group(0) @binding(2) var<storage, read> vc: array<u32>;
@group(0) @binding(3) var<storage, read> block_tables: array<u32>;
@group(0) @binding(4) var<storage, read> tiles: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
struct P { num_kv_heads: u32, num_heads: u32, max_blocks: u32, bt_off: u32, partition_tokens: u32, num_partitions: u32,
           scale_log2: f32, cap_log2: f32 }
var<immediate> p: P;

const D: u32 = {{D}}u;        // head size (vec4 aligned)
const DV4: u32 = {{DV4}}u;    // vec4s of a head
const G: u32 = {{G}}u;        // query heads of a KV head
const BQ: u32 = {{BQ}}u;      // query positions of a tile
const R: u32 = {{R}}u;        // rows of a tile: BQ * G
const BK: u32 = {{BK}}u;      // keys of a K/V tile
const BSZ: u32 = {{BSZ}}u;    // tokens of a cache block
const WG: u32 = {{WG}}u;      // invocations: RT * CT
const CT: u32 = {{CT}}u;
const TM: u32 = {{TM}}u;      // rows an invocation owns
const TN: u32 = {{TN}}u;      // keys an invocation scores a tile
const ND4: u32 = {{ND4}}u;    // output vec4s an invocation owns a row
const QST: u32 = {{QST}}u;    // vec4 stride of a row of qs / kvs: DV4 + 1
const PST: u32 = {{PST}}u;    // float stride of a row of ps: BK + 1
const SPLIT: bool = {{SPLIT}};
const SPREAD: bool = {{SPREAD}};  // the softmax in every invocation (else one invocation a row)
const SV4: bool = {{SV4}};        // vec4 score accumulators (else a dot() a step)
// The lowest finite f32: the score of a key a row may not see (its weight is set to 0, not computed) and the m of a
// row that has seen no key yet. Every finite score is at least this, so a row whose scores are all below any other
// sentinel (logits of -1e31 with keys near 1e30) still takes its largest one as its max.
const LOWEST: f32 = -3.4028234663852886e38;

var<workgroup> qs: array<vec4<f32>, {{QS}}>;   // the tile's queries, pre-scaled: R x QST
var<workgroup> kvs: array<vec4<f32>, {{KVS}}>; // a K or V tile: BK x QST
var<workgroup> ps: array<f32, {{PS}}>;         // scores, then weights: R x PST
// not SPREAD: alpha of each row a tile; m and l at the end. SPREAD: each (row, invocation)'s partial max a tile
// (R x CT); its partial sum l at the end
var<workgroup> rowstat: array<f32, {{RS}}>;

// where a key's record sits: KV head, sequence, physical block, offset in the block, position
struct TokenAt { h: u32, seq: u32, phys: u32, off: u32, pos: u32 }
// a K/V tile: KV head, sequence, its block-table row (first word), its first key position, its keys, the invocation
// (what K_TILE / V_TILE code reads)
struct TileAt { h: u32, seq: u32, bt: u32, k0: u32, n: u32, li: u32 }

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let tile = tiles[wid.x];
  let seq = tile.x;
  let row0 = tile.y;
  let pos0 = tile.z;
  let nq = tile.w;
  let kvh = wid.y;
  let part = wid.z;
  let bt = p.bt_off + seq * p.max_blocks;
  let kbeg = part * p.partition_tokens;
  let kend = min(pos0 + nq, kbeg + p.partition_tokens);  // keys [kbeg, kend): none past the tile's last query
  let rt = li / CT;
  let ct = li % CT;

  for (var e = li; e < R * DV4; e = e + WG) {
    let r = e / DV4;
    let c = e % DV4;
    let qi = r / G;
    var x = vec4<f32>(0.0);
    if (qi < nq) {
      let b = ((row0 + qi) * p.num_heads + kvh * G + r % G) * D + 4u * c;
      x = vec4<f32>(q[b], q[b + 1u], q[b + 2u], q[b + 3u]) * p.scale_log2;
    }
    qs[r * QST + c] = x;
  }
  var m = LOWEST;  // not SPREAD: the online softmax of row li (li < R)
  var l = 0.0;
  var mr: array<f32, TM>;  // SPREAD: the online softmax of the invocation's rows (l: of its own keys)
  var lr: array<f32, TM>;
  // @unroll
  for (var i = 0u; i < TM; i = i + 1u) {
    mr[i] = LOWEST;
    lr[i] = 0.0;
  }
  var acc: array<vec4<f32>, {{TMND4}}>;
  workgroupBarrier();

  for (var k0 = kbeg; k0 < kend; k0 = k0 + BK) {
    let nk = min(BK, kend - k0);
    for (var e = li; e < nk * DV4; e = e + WG) {
      let j = e / DV4;
      let kp = k0 + j;
      kvs[j * QST + e % DV4] = load_k4(TokenAt(kvh, seq, block_tables[bt + kp / BSZ], kp % BSZ, kp), e % DV4);
    }
    workgroupBarrier();
    let tile = TileAt(kvh, seq, bt, k0, nk, li);
{{K_TILE}}

    // zeroed by hand: a function-scope var declared without a value is zeroed once a call, not once a loop. Two
    // nested loops of at most 16 (kvviz/gpu/shaders.py UNROLL_MAX) unroll where one of TM * TN may not, which would
    // leave the arrays out of registers and add a loop the loop budget (prefill.py loop_cost) does not count.
    var s: array<f32, {{TMTN}}>;
    var s4: array<vec4<f32>, {{TMTN}}>;
    // @unroll
    for (var i = 0u; i < TM; i = i + 1u) {
      // @unroll
      for (var n = 0u; n < TN; n = n + 1u) {
        s[i * TN + n] = 0.0;
        s4[i * TN + n] = vec4<f32>(0.0);
      }
    }
    for (var c = 0u; c < DV4; c = c + 1u) {
      var kv: array<vec4<f32>, TN>;
      // @unroll
      for (var n = 0u; n < TN; n = n + 1u) { kv[n] = kvs[min(ct + CT * n, BK - 1u) * QST + c]; }
      // @unroll
      for (var i = 0u; i < TM; i = i + 1u) {
        let qv = qs[min(rt * TM + i, R - 1u) * QST + c];
        // @unroll
        for (var n = 0u; n < TN; n = n + 1u) {
          if (SV4) {
            s4[i * TN + n] = fma(qv, kv[n], s4[i * TN + n]);
          } else {
            s[i * TN + n] = s[i * TN + n] + dot(qv, kv[n]);
          }
        }
      }
    }
    // @unroll
    for (var i = 0u; i < TM; i = i + 1u) {
      let r = rt * TM + i;
      var pm = LOWEST;
      // @unroll
      for (var n = 0u; n < TN; n = n + 1u) {
        let j = ct + CT * n;
        if (SV4) {
          let a = s4[i * TN + n];
          s[i * TN + n] = (a.x + a.y) + (a.z + a.w);
        }
        var sc = s[i * TN + n];
        if (p.cap_log2 > 0.0) {
          sc = p.cap_log2 * tanh(clamp(sc / p.cap_log2, -15.0, 15.0));
        }
        // rows past R (a TM x RT grid over more than R rows) see no key: r / G >= BQ >= nq
        let see = j < nk && k0 + j <= pos0 + r / G && r / G < nq;
        let x = select(LOWEST, sc, see);
        if (SPREAD) {
          s[i * TN + n] = x;
          pm = max(pm, x);
        } else if (r < R && j < BK) {
          ps[r * PST + j] = x;
        }
      }
      if (SPREAD && r < R) {
        rowstat[r * CT + ct] = pm;
      }
    }
    workgroupBarrier();

    if (SPREAD) {
      // @unroll
      for (var i = 0u; i < TM; i = i + 1u) {
        let r = rt * TM + i;
        let rr = min(r, R - 1u);
        var mx = LOWEST;
        // @unroll
        for (var c = 0u; c < CT; c = c + 1u) { mx = max(mx, rowstat[rr * CT + c]); }
        let mn = max(mr[i], mx);
        let al = exp2(mr[i] - mn);
        mr[i] = mn;
        var sum = 0.0;
        // @unroll
        for (var n = 0u; n < TN; n = n + 1u) {
          let x = s[i * TN + n];
          let w = select(0.0, exp2(x - mn), x > LOWEST);
          sum = sum + w;
          let j = ct + CT * n;
          if (r < R && j < BK) {
            ps[r * PST + j] = w;
          }
        }
        lr[i] = lr[i] * al + sum;
        // @unroll
        for (var n = 0u; n < ND4; n = n + 1u) { acc[i * ND4 + n] = acc[i * ND4 + n] * al; }
      }
    } else if (li < R) {
      var mx = LOWEST;
      for (var j = 0u; j < nk; j = j + 1u) { mx = max(mx, ps[li * PST + j]); }
      let mn = max(m, mx);
      let al = exp2(m - mn);
      var sum = 0.0;
      for (var j = 0u; j < nk; j = j + 1u) {
        let x = ps[li * PST + j];
        let w = select(0.0, exp2(x - mn), x > LOWEST);
        ps[li * PST + j] = w;
        sum = sum + w;
      }
      l = l * al + sum;
      m = mn;
      rowstat[li] = al;
    }
    for (var e = li; e < nk * DV4; e = e + WG) {
      let j = e / DV4;
      let kp = k0 + j;
      kvs[j * QST + e % DV4] = load_v4(TokenAt(kvh, seq, block_tables[bt + kp / BSZ], kp % BSZ, kp), e % DV4);
    }
    workgroupBarrier();
{{V_TILE}}

    if (!SPREAD) {
      // @unroll
      for (var i = 0u; i < TM; i = i + 1u) {
        let al = rowstat[min(rt * TM + i, R - 1u)];
        // @unroll
        for (var n = 0u; n < ND4; n = n + 1u) { acc[i * ND4 + n] = acc[i * ND4 + n] * al; }
      }
    }
    for (var j = 0u; j < nk; j = j + 1u) {
      var vv: array<vec4<f32>, ND4>;
      // @unroll
      for (var n = 0u; n < ND4; n = n + 1u) { vv[n] = kvs[j * QST + min(ct + CT * n, DV4 - 1u)]; }
      // @unroll
      for (var i = 0u; i < TM; i = i + 1u) {
        let w = vec4<f32>(ps[min(rt * TM + i, R - 1u) * PST + j]);
        // @unroll
        for (var n = 0u; n < ND4; n = n + 1u) { acc[i * ND4 + n] = fma(w, vv[n], acc[i * ND4 + n]); }
      }
    }
    workgroupBarrier();
  }

  if (SPREAD) {
    // @unroll
    for (var i = 0u; i < TM; i = i + 1u) {
      let r = rt * TM + i;
      if (r < R) {
        rowstat[r * CT + ct] = lr[i];
      }
    }
  } else if (li < R) {
    rowstat[li] = m;
    rowstat[R + li] = l;
  }
  workgroupBarrier();
  // @unroll
  for (var i = 0u; i < TM; i = i + 1u) {
    let r = rt * TM + i;
    let qi = r / G;
    if (r < R && qi < nq) {
      let row = (row0 + qi) * p.num_heads + kvh * G + r % G;
      var rm = 0.0;
      var rl = 0.0;
      if (SPREAD) {
        rm = mr[i];
        // @unroll
        for (var c = 0u; c < CT; c = c + 1u) { rl = rl + rowstat[r * CT + c]; }
      } else {
        rm = rowstat[r];
        rl = rowstat[R + r];
      }
      if (SPLIT) {
        let base = (row * p.num_partitions + part) * (D + 2u);
        if (ct == 0u) {
          out[base] = rm;
          out[base + 1u] = rl;
        }
        // @unroll
        for (var n = 0u; n < ND4; n = n + 1u) {
          let c = ct + CT * n;
          if (c < DV4) {
            let a = acc[i * ND4 + n];
            out[base + 2u + 4u * c] = a.x;
            out[base + 3u + 4u * c] = a.y;
            out[base + 4u + 4u * c] = a.z;
            out[base + 5u + 4u * c] = a.w;
          }
        }
      } else {
        let inv = select(0.0, 1.0 / rl, rl > 0.0);
        // @unroll
        for (var n = 0u; n < ND4; n = n + 1u) {
          let c = ct + CT * n;
          if (c < DV4) {
            let a = acc[i * ND4 + n] * inv;
            let o = row * D + 4u * c;
            out[o] = a.x;
            out[o + 1u] = a.y;
            out[o + 2u] = a.z;
            out[o + 3u] = a.w;
          }
        }
      }
    }
  }
}
// ---- end of prefill_kernel.wgsl
