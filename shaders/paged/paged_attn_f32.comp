#version 450
// PagedAttention decode over the f32 cache: the baseline every quantised path is measured against.
// Same workgroup structure, passes and normaliser as the int8 seed (paged_attn_q8.comp), so the only
// difference between the two outputs is the quantisation of K and V:
//   pass 1: max logit; passes 2+3 fused: exp(l - max), tile sums, V accumulation;
//   out = sum(exp(l - max) * v) / (sum(exp(l - max)) + 1e-6).
// f32 cache layout: [num_blocks, num_kv_heads, block_size, head_size].
layout(local_size_x = 128, local_size_y = 1, local_size_z = 1) in;
layout(set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(set = 0, binding = 1) readonly buffer KC { float kc[]; };
layout(set = 0, binding = 2) readonly buffer VC { float vc[]; };
layout(set = 0, binding = 3) readonly buffer BT { uint block_tables[]; };
layout(set = 0, binding = 4) readonly buffer CL { uint context_lens[]; };
layout(set = 0, binding = 5) buffer O { float o[]; };
layout(push_constant) uniform Pc {
  uint num_kv_heads;
  uint num_heads;
  uint head_size;
  uint block_size;
  uint max_num_blocks_per_seq;
  uint q_stride;
  uint max_context_len;
  float scale;
};
const uint MAX_HEAD_SIZE = 256u;
const uint WG = 128u;
shared float s_q[MAX_HEAD_SIZE];
shared float s_red[WG];
shared float s_acc[MAX_HEAD_SIZE];
shared float s_w[WG];
shared uint s_pb[WG];
shared uint s_bo[WG];

float qk_f32(uint kbase) {
  float acc = 0.0;
  for (uint d = 0u; d < head_size; d++) { acc += s_q[d] * kc[kbase + d]; }
  return acc;
}

void main() {
  uint head_idx = gl_WorkGroupID.x;
  uint seq_idx = gl_WorkGroupID.y;
  uint tid = gl_LocalInvocationID.x;
  uint nthreads = gl_WorkGroupSize.x;
  uint context_len = context_lens[seq_idx];
  if (context_len > max_context_len) { context_len = max_context_len; }
  uint num_queries_per_kv = num_heads / num_kv_heads;
  uint kv_head_idx = head_idx / num_queries_per_kv;
  uint head_stride = block_size * head_size;
  uint block_stride = num_kv_heads * head_stride;
  uint q_base = seq_idx * q_stride + head_idx * head_size;
  for (uint i = tid; i < head_size; i += nthreads) { s_q[i] = q[q_base + i]; }
  barrier();
  uint bt_base = seq_idx * max_num_blocks_per_seq;
  float local_max = -3.402823466e38;
  for (uint t = tid; t < context_len; t += nthreads) {
    uint phys_block = block_tables[bt_base + t / block_size];
    uint kbase = phys_block * block_stride + kv_head_idx * head_stride + (t % block_size) * head_size;
    local_max = max(local_max, scale * qk_f32(kbase));
  }
  s_red[tid] = local_max;
  barrier();
  for (uint stride = nthreads / 2u; stride > 0u; stride >>= 1) {
    if (tid < stride) { s_red[tid] = max(s_red[tid], s_red[tid + stride]); }
    barrier();
  }
  float qk_max = s_red[0];
  barrier();
  float exp_sum = 0.0;
  for (uint i = tid; i < head_size; i += nthreads) { s_acc[i] = 0.0; }
  barrier();
  for (uint base = 0u; base < context_len; base += WG) {
    uint t = base + tid;
    float w = 0.0;
    uint phys_block = 0u;
    uint block_off = 0u;
    if (t < context_len) {
      phys_block = block_tables[bt_base + t / block_size];
      block_off = t % block_size;
      uint kbase = phys_block * block_stride + kv_head_idx * head_stride + block_off * head_size;
      w = exp(scale * qk_f32(kbase) - qk_max);
    }
    s_w[tid] = w;
    s_pb[tid] = phys_block;
    s_bo[tid] = block_off;
    s_red[tid] = w;
    barrier();
    for (uint stride = WG / 2u; stride > 0u; stride >>= 1) {
      if (tid < stride) { s_red[tid] += s_red[tid + stride]; }
      barrier();
    }
    if (tid == 0u) { exp_sum += s_red[0]; }
    barrier();
    uint tile = min(WG, context_len - base);
    for (uint d = tid; d < head_size; d += nthreads) {
      float acc = 0.0;
      for (uint j = 0u; j < tile; j++) {
        uint vbase = s_pb[j] * block_stride + kv_head_idx * head_stride + s_bo[j] * head_size;
        acc += s_w[j] * vc[vbase + d];
      }
      s_acc[d] += acc;
    }
    barrier();
  }
  if (tid == 0u) { s_red[0] = 1.0 / (exp_sum + 1e-6); }
  barrier();
  float inv_sum = s_red[0];
  uint o_base = seq_idx * num_heads * head_size + head_idx * head_size;
  for (uint i = tid; i < head_size; i += nthreads) { o[o_base + i] = s_acc[i] * inv_sum; }
}
