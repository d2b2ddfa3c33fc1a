// Device copy through a compute shader: the bandwidth a streaming kernel can reach on this adapter.
// 16 bytes a thread, grid-stride over `n_vec4` elements; dispatch (min(groups, 65535), ceil, 1).
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;
struct Params { n_vec4: u32, stride: u32 }
var<immediate> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let row = nwg.x * 256u;
  var i = gid.x + gid.y * row;
  while (i < p.n_vec4) {
    dst[i] = src[i];
    i += p.stride;
  }
}
