// Row gather: dst[r * width + c] = src[r * ld + offset + c] for r < rows, c < width (32-bit words).
// A workgroup a row, its 64 threads striding over the row's words; the row is y * gx + x of a 2-D grid, so more
// rows than one grid dimension holds take one dispatch.
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
struct Params { rows: u32, width: u32, ld: u32, offset: u32, gx: u32 }
var<immediate> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let r = wid.y * p.gx + wid.x;
  if (r >= p.rows) {
    return;
  }
  let s0 = r * p.ld + p.offset;
  let d0 = r * p.width;
  for (var c = lid; c < p.width; c += 64u) {
    dst[d0 + c] = src[s0 + c];
  }
}
