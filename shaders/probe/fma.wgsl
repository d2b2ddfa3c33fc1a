// Compute ceiling: fused multiply-add throughput of this adapter (kvviz/gpu/fma.py).
// {{ENABLE}} is "enable f16;" for the f16 variant, empty for f32; {{T}} is the scalar type.
// Every invocation runs p.iters steps of 8 independent vec4 FMA chains (8 x 4 lanes x 2 flops = 64
// flops a step), seeded from its id so nothing folds at compile time; the sum is written out so
// nothing is dead. Grid (groups, 1, 1) of 256 threads. p.iters stays far below a software
// rasteriser's per-invocation loop budget (docs/loop-limits.md).
{{ENABLE}}
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
struct P { iters: u32, seed: f32 }
var<immediate> p: P;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let s = {{T}}(f32(gid.x & 255u) * 1e-3 + p.seed);
  let m = vec4<{{T}}>({{T}}(0.999), {{T}}(0.998), {{T}}(0.997), {{T}}(0.996));
  let c = vec4<{{T}}>({{T}}(1e-3));
  var a0 = vec4<{{T}}>(s); var a1 = a0 + c; var a2 = a1 + c; var a3 = a2 + c;
  var a4 = a3 + c; var a5 = a4 + c; var a6 = a5 + c; var a7 = a6 + c;
  for (var i = 0u; i < p.iters; i = i + 1u) {
    a0 = fma(a0, m, c); a1 = fma(a1, m, c); a2 = fma(a2, m, c); a3 = fma(a3, m, c);
    a4 = fma(a4, m, c); a5 = fma(a5, m, c); a6 = fma(a6, m, c); a7 = fma(a7, m, c);
  }
  let t = (a0 + a1) + (a2 + a3) + (a4 + a5) + (a6 + a7);
  out[gid.x] = f32(t.x + t.y + t.z + t.w);
}
