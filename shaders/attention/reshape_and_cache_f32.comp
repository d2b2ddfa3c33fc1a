#version 450
// reshape_and_cache, f32: the baseline writer the int8 seed (reshape_and_cache_q8.comp) mirrors.
// One workgroup per (token, kv head), 128 threads; copies the head vector into its paged slot.
//
// f32 cache (K and V), f32 buffer, logical layout [num_blocks, num_kv_heads, block_size, head_size].
// key/value inputs: [num_tokens, num_kv_heads, head_size] f32 with row strides key_stride/value_stride.
// slot_mapping: [num_tokens] u32, 0xFFFFFFFF = padding token (skipped).
layout(local_size_x = 128, local_size_y = 1, local_size_z = 1) in;
layout(set = 0, binding = 0) readonly buffer K { float key[]; };
layout(set = 0, binding = 1) readonly buffer V { float value[]; };
layout(set = 0, binding = 2) buffer KC { float key_cache[]; };
layout(set = 0, binding = 3) buffer VC { float value_cache[]; };
layout(set = 0, binding = 4) readonly buffer SM { uint slot_mapping[]; };
layout(push_constant) uniform Pc {
  uint key_stride;
  uint value_stride;
  uint num_kv_heads;
  uint head_size;
  uint block_size;
};
const uint PAD_SLOT = 0xFFFFFFFFu;
const uint WG = 128u;
void main() {
  uint token_idx = gl_WorkGroupID.x;
  uint head_idx = gl_WorkGroupID.y;
  uint tid = gl_LocalInvocationID.x;
  uint slot = slot_mapping[token_idx];
  if (slot == PAD_SLOT) { return; }
  uint block_idx = slot / block_size;
  uint block_off = slot % block_size;
  uint head_stride = block_size * head_size;
  uint block_stride = num_kv_heads * head_stride;
  uint dst_base = block_idx * block_stride + head_idx * head_stride + block_off * head_size;
  uint k_src = token_idx * key_stride + head_idx * head_size;
  uint v_src = token_idx * value_stride + head_idx * head_size;
  for (uint d = tid; d < head_size; d += WG) {
    key_cache[dst_base + d] = key[k_src + d];
    value_cache[dst_base + d] = value[v_src + d];
  }
}
