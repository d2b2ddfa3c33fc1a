// vLLM-style FP8, per-tensor scales: copy the K and V scales (scales[0], scales[kvh]) into words 2 and 3 of a
// 4-word tensor buffer, the layout the fast decode reads per-tensor FP8 scales from (kvviz/attention/split_decode.py,
// the fp8_* per_tensor writer's [amax K, amax V, scale K, scale V]). Runs after fp8_vllm_scale.wgsl. One thread.
@group(0) @binding(0) var<storage, read> scales: array<u32>;
@group(0) @binding(1) var<storage, read_write> tensor: array<u32>;
struct P { kvh: u32 }
var<immediate> p: P;

@compute @workgroup_size(1)
fn main() {
  tensor[2] = scales[0];
  tensor[3] = scales[p.kvh];
}
