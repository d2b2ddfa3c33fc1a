#version 450
// PagedAttention decode over the f32 cache: the baseline every quantised path is measured against.
// The context is split into partitions of PARTITION tokens, one workgroup per (head, seq, partition),
// so no invocation's loops grow with the context (software rasterisers such as lavapipe stop every
// invocation's loops after a fixed total of iterations: docs/loop-limits.md). Inside a partition the
// passes and arithmetic are the int8 seed's (paged_attn_q8.comp): pass 1 the max logit; passes 2+3
// fused: exp(l - max), tile sums, V accumulation. Each workgroup writes its partition's
//   partials[(seq, head, part)] = [max m_p, sum s_p, acc_p[0..head_size)]
// and paged_attn_reduce.wgsl combines them: out = sum_p acc_p e^(m_p-M) / (sum_p s_p e^(m_p-M) + 1e-6).
// With one partition (context <= PARTITION) the output is bit-identical to the unsplit kernel's.
// f32 cache layout: [num_blocks, num_kv_heads, block_size, head_size].
// Grid: (num_heads, num_seqs, num_partitions).
layout(local_size_x = 128, local_size_y = 1, local_size_z = 1) in;
layout(set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(set = 0, binding = 1) readonly buffer KC { float kc[]; };
layout(set = 0, binding = 2) readonly buffer VC { float vc[]; };
layout(set = 0, binding = 3) readonly buffer BT { uint block_tables[]; };
layout(set = 0, binding = 4) readonly buffer CL { uint context_lens[]; };
layout(set = 0, binding = 5) buffer PART { float partials[]; };
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
const uint PARTITION = 512u;
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
  uint part = gl_WorkGroupID.z;
  uint tid = gl_LocalInvocationID.x;
  uint nthreads = gl_WorkGroupSize.x;
  uint context_len = context_lens[seq_idx];
  if (context_len > max_context_len) { context_len = max_context_len; }
  uint p_base = ((seq_idx * num_heads + head_idx) * gl_NumWorkGroups.z + part) * (head_size + 2u);
  uint t_begin = part * PARTITION;
  // Workgroup-uniform: a partition past this sequence's end only marks itself empty.
  if (t_begin >= context_len) {
    if (tid == 0u) { partials[p_base] = -3.402823466e38; partials[p_base + 1u] = 0.0; }
    for (uint i = tid; i < head_size; i += nthreads) { partials[p_base + 2u + i] = 0.0; }
    return;
  }
  uint t_end = min(t_begin + PARTITION, context_len);
  uint num_queries_per_kv = num_heads / num_kv_heads;
  uint kv_head_idx = head_idx / num_queries_per_kv;
  uint head_stride = block_size * head_size;
  uint block_stride = num_kv_heads * head_stride;
  uint q_base = seq_idx * q_stride + head_idx * head_size;
  for (uint i = tid; i < head_size; i += nthreads) { s_q[i] = q[q_base + i]; }
  barrier();
  uint bt_base = seq_idx * max_num_blocks_per_seq;
  float local_max = -3.402823466e38;
  for (uint t = t_begin + tid; t < t_end; t += nthreads) {
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
  for (uint base = t_begin; base < t_end; base += WG) {
    uint t = base + tid;
    float w = 0.0;
    uint phys_block = 0u;
    uint block_off = 0u;
    if (t < t_end) {
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
    uint tile = min(WG, t_end - base);
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
  if (tid == 0u) { partials[p_base] = qk_max; partials[p_base + 1u] = exp_sum; }
  for (uint i = tid; i < head_size; i += nthreads) { partials[p_base + 2u + i] = s_acc[i]; }
}
