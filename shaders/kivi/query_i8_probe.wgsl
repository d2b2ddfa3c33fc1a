// The fast KIVI decode's int8 query helpers (kivi/query_i8.wgsl) on given rows, for their bit-for-bit check against
// numpy (kvviz/families/kivi/oracle.py requantize_query): row r of `x` (ROW vec4s) -> its ROW packed code words
// (pack4xI8 of the 4 channels' codes), then the f32 bits of its factor and step.
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
struct P { rows: u32, row: u32 }
var<immediate> p: P;

// #include "kivi/query_i8.wgsl"

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let r = gid.x;
  if (r >= p.rows) {
    return;
  }
  var m = 0.0;
  for (var i = 0u; i < p.row; i = i + 1u) {
    m = max(m, qi8_amax(x[r * p.row + i]));
  }
  let f = qi8_scales(m);
  let o = r * (p.row + 2u);
  for (var i = 0u; i < p.row; i = i + 1u) {
    out[o + i] = pack4xI8(qi8_codes(x[r * p.row + i], f.x));
  }
  out[o + p.row] = bitcast<u32>(f.x);
  out[o + p.row + 1u] = bitcast<u32>(f.y);
}
