// Start-up self-check: how many loop iterations does this adapter let one invocation run?
// Mesa's llvmpipe/lavapipe gives every shader invocation one loop limiter (65535 in Mesa 22-25),
// decremented at every back-edge of every loop; once it reaches 0 every loop exits early and the
// shader's result is silently wrong. Hardware drivers have no such bound.
// Each of the 64 lanes runs loop A for p.n_a iterations, then loop B for p.n_b, counting what it
// really ran: counts[2 * lane] = iterations of A, counts[2 * lane + 1] = iterations of B.
// The loop body reads memory so no compiler can fold the loop into a closed form.
@group(0) @binding(0) var<storage, read> ones: array<u32>;
@group(0) @binding(1) var<storage, read_write> counts: array<u32>;
struct P { n_a: u32, n_b: u32 }
var<immediate> p: P;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>) {
  var a = 0u;
  for (var i = 0u; i < p.n_a; i = i + 1u) { a = a + ones[(i + lid.x) & 7u]; }
  var b = 0u;
  for (var i = 0u; i < p.n_b; i = i + 1u) { b = b + ones[(i ^ lid.x) & 7u]; }
  counts[2u * lid.x] = a;
  counts[2u * lid.x + 1u] = b;
}
