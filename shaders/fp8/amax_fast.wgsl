// #include "common/quant.wgsl"
// #include "common/write_fast.wgsl"
// Per-tensor amax for the fast FP8 writer's per_tensor mode: tensor[0] (K) / tensor[1] (V) = max |x| bits
// over every real (non-padding) row and head (unsigned order of |x| bits = float order). Lane groups of L
// lanes a row reduce by red_min2, the rows of a workgroup through workgroup atomics, then one atomicMax a
// workgroup on the tensor words. tensor must be zeroed before. Grid: see write_common.wgsl, except that the
// workgroups stride over the rows (workgroup w takes the row blocks w, w + W, ... of R rows, W = the grid's
// workgroups): any grid covers every row once, and a grid of fewer workgroups than row blocks (the launcher
// gives each AMAX_BLOCKS, kvviz/attention/writers.py) does one reduction and one pair of atomics a workgroup for
// several blocks.
@group(0) @binding(0) var<storage, read> key_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> val_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read_write> tensor: array<atomic<u32>>;
struct P { kvh: u32, hd: u32, bs: u32, wpt: u32, rows: u32, gx: u32 }
var<immediate> p: P;
const NV: u32 = {{NV}}u;
const PAD: bool = {{PAD}};  // the lanes' NV vec4s cover more than the row: those past it are not read
var<workgroup> s_amax: array<atomic<u32>, 2>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let lane = lid % L;
  let total = nwg.x * nwg.y;
  var m = vec2<u32>(0xFFFFFFFFu);
  for (var blk = wg.y * p.gx + wg.x; blk * R < p.rows; blk = blk + total) {
    let row = blk * R + lid / L;
    let ok = row < p.rows;
    let src = row * (p.hd / 4u) + lane;
    if (ok) {
      // the row's slot and its values loaded together (the padding test masks the keys after: no load waits on it)
      let pad = slots[row / p.kvh] == PAD_SLOT;
      var r = vec2<u32>(0xFFFFFFFFu);
      // @unroll
      for (var j = 0u; j < NV; j = j + 1u) {
        if (!PAD || lane + j * L < p.hd / 4u) {
          r = min(r, vec2<u32>(amax_key4(key_in[src + j * L]), amax_key4(val_in[src + j * L])));
        }
      }
      m = min(m, select(r, vec2<u32>(0xFFFFFFFFu), pad));
    }
  }
  // every lane's key covers only live rows (0xFFFFFFFF: none): ~m is 0 there, harmless to atomicMax
  m = red_min2(m, lid, L);
  if (lid == 0u) {
    atomicStore(&s_amax[0], 0u);
    atomicStore(&s_amax[1], 0u);
  }
  workgroupBarrier();
  if (lane == 0u) {
    atomicMax(&s_amax[0], ~m.x);
    atomicMax(&s_amax[1], ~m.y);
  }
  workgroupBarrier();
  if (lid == 0u) {
    let a = atomicLoad(&s_amax[0]);
    let b = atomicLoad(&s_amax[1]);
    if (a != 0u) { atomicMax(&tensor[0], a); }
    if (b != 0u) { atomicMax(&tensor[1], b); }
  }
}
