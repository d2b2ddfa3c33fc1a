// ---- shaders/kivi/value.wgsl: one element of a KIVI cache (kivi/dequant.wgsl, kivi/prefill.wgsl). Position pos of
// sequence seq, held in slot `off` of physical block `blk`, channel c, of K (which 0) or V (1):
//   pos >= n_q (residual)    : the f32 row res[res_off + pos - n_q, K|V, head, :];
//   K, pos < n_q             : code * scale_c + zero_c of group pos/32 (side stream, see kivi_write_kgroup);
//   V, pos < n_q             : code * scale + zero of the token's record.
// info = [seq_info: (context_len, n_q, res_off, 0) per sequence | block tables from word bt_off, mbs a sequence].
// The includer defines BITS, load_w(which, word) (K: which 0, V: 1), and the bindings res (f32) and info (u32).
const CPW: u32 = 32u / BITS;

// the layout's sizes: KV heads, head size (padded), block size, words of a (block, KV head) of K, the block tables
struct KiviShape { kvh: u32, hd: u32, bs: u32, kstride: u32, bt_off: u32, mbs: u32 }

// word o of the sequence's K side stream, in its logical block o / ws at offset o % ws
fn side_word(ks: KiviShape, seq: u32, h: u32, o: u32) -> u32 {
  let ws = ks.hd * ks.bs / 16u;
  let phys = info[ks.bt_off + seq * ks.mbs + o / ws];
  return (phys * ks.kvh + h) * ks.kstride + ks.bs * (ks.hd * BITS / 32u) + o % ws;
}

fn kivi_value(ks: KiviShape, which: u32, seq: u32, blk: u32, h: u32, off: u32, pos: u32, c: u32) -> f32 {
  let n_q = info[seq * 4u + 1u];
  let res_off = info[seq * 4u + 2u];
  let kw = ks.hd * BITS / 32u;
  var v: f32;
  if (pos >= n_q) {
    v = res[(((res_off + pos - n_q) * 2u + which) * ks.kvh + h) * ks.hd + c];
  } else if (which == 0u) {
    let word = load_w(0u, (blk * ks.kvh + h) * ks.kstride + off * kw + c / CPW);
    let code = extractBits(word, BITS * (c % CPW), BITS);
    let o = 2u * ks.hd * (pos / 32u) + 2u * c;
    v = f32(code) * bitcast<f32>(load_w(0u, side_word(ks, seq, h, o))) + bitcast<f32>(load_w(0u, side_word(ks, seq, h, o + 1u)));
  } else {
    let rec = ((blk * ks.kvh + h) * ks.bs + off) * (kw + 2u);
    let code = extractBits(load_w(1u, rec + c / CPW), BITS * (c % CPW), BITS);
    v = f32(code) * bitcast<f32>(load_w(1u, rec + kw)) + bitcast<f32>(load_w(1u, rec + kw + 1u));
  }
  return v;
}
// ---- end of kivi/value.wgsl
