// #include "common/quant.wgsl"
// KIVI ({{BITS}}-bit) dequantise into the f32 paged cache. Grid (items, kv_heads, 2 = K|V), 64 threads;
// items[i] = (physical block, seq, logical block, 0). Position pos = logical*bs + offset: pos >= context_len is
// not written, every other element is kivi/value.wgsl's (the residual row, or code * scale + zero).
// info = [seq_info: (context_len, n_q, res_off, 0) per sequence | block tables].
@group(0) @binding(0) var<storage, read> k_cache: array<u32>;
@group(0) @binding(1) var<storage, read> v_cache: array<u32>;
@group(0) @binding(2) var<storage, read> res: array<f32>;
@group(0) @binding(3) var<storage, read> info: array<u32>;
@group(0) @binding(4) var<storage, read> items: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> k_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> v_out: array<f32>;
struct P { kvh: u32, hd: u32, bs: u32, kstride: u32, bt_off: u32, mbs: u32, win0: u32 }
var<immediate> p: P;
const BITS: u32 = {{BITS}}u;

fn load_w(which: u32, i: u32) -> u32 { if (which == 0u) { return k_cache[i]; } return v_cache[i]; }
// #include "kivi/value.wgsl"

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let item = items[wg.x];
  let blk = item.x;
  let seq = item.y;
  let lb = item.z;
  let h = wg.y;
  let which = wg.z;
  let ctx_len = info[seq * 4u];
  let ks = KiviShape(p.kvh, p.hd, p.bs, p.kstride, p.bt_off, p.mbs);
  let n = p.bs * p.hd;
  let out_base = ((blk - p.win0) * p.kvh + h) * n;
  for (var i = lid.x; i < n; i = i + 64u) {
    let off = i / p.hd;
    let c = i % p.hd;
    let pos = lb * p.bs + off;
    if (pos >= ctx_len) { continue; }
    let v = kivi_value(ks, which, seq, blk, h, off, pos, c);
    if (which == 0u) { k_out[out_base + i] = v; } else { v_out[out_base + i] = v; }
  }
}
