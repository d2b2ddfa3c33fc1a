// Fused multiply-add throughput by the form of the arithmetic (kvviz/gpu/fma.py: FmaForm): the scalar type T (f32
// or f16), the vector width W (1, 2, 4), C independent chains, R steps of every chain in one loop iteration, and the
// step written as fma(a, m, c) or as a * m + c. shaders/probe/fma.wgsl is the form W = 4, C = 8, R = 1, fma; the
// other forms (and their multipliers: a constant, a value of the immediates `mul`, another chain) tell what the compilers do with the types: whether vec2<f16> and vec4<f16> become the hardware's
// packed half2 operations, and how much of an iteration is the loop (naga bounds every loop with a counter of its
// own). {{ENABLE}}: "enable f16;" for f16. The code blocks come from probe/fma_forms.wgsl.j2.
{{ENABLE}}
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
struct P { iters: u32, seed: f32, mul: f32 }
var<immediate> p: P;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let s = {{T}}(f32(gid.x & 255u) * 1e-3 + p.seed);
{{SETUP}}
  for (var i = 0u; i < p.iters; i = i + 1u) {
{{STEP}}
  }
{{SINK}}
}
