// Which subgroup size does this adapter run compute shaders with? The fast decode shares a token row
// between up to subgroup_size lanes (summed by subgroupShuffleXor), so it must know.
// out[i] = subgroup_size seen by invocation i of one 64-invocation workgroup.
@group(0) @binding(0) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) i: u32, @builtin(subgroup_size) sg: u32) {
  out[i] = sg;
}
