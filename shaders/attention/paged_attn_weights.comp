#version 450
// Attention weights (softmax over positions) of the paged decode, for every (sequence, head): the
// logits are computed exactly as in paged_attn_q8.comp / paged_attn_f32.comp.
// Split like the decode: one workgroup per (head, seq, partition of PARTITION positions) writes its
// positions' logits to `o` and its partition's max m_p and sum s_p = sum e^(l - m_p) to `stats`;
// softmax_partitioned.wgsl then writes o = e^(l - M) * (1 / (sum_p s_p e^(m_p - M) + 1e-6)), the
// decode's normaliser (with one partition, bit-identical to the unsplit kernel).
// Build with -DKV_Q8=1 for the int8 cache (u32 words, per-token scale word), else the f32 cache.
// o: [num_seqs, num_heads, max_context_len] f32; stats: [num_seqs, num_heads, num_partitions, 2].
// Grid: (num_heads, num_seqs, num_partitions).
layout(local_size_x = 128, local_size_y = 1, local_size_z = 1) in;
layout(set = 0, binding = 0) readonly buffer Q { float q[]; };
#ifdef KV_Q8
layout(set = 0, binding = 1) readonly buffer KC { uint kc[]; };
#else
layout(set = 0, binding = 1) readonly buffer KC { float kc[]; };
#endif
layout(set = 0, binding = 2) readonly buffer BT { uint block_tables[]; };
layout(set = 0, binding = 3) readonly buffer CL { uint context_lens[]; };
layout(set = 0, binding = 4) buffer O { float o[]; };
layout(set = 0, binding = 5) buffer ST { float stats[]; };
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

#ifdef KV_Q8
float logit(uint kbase, uint hs4) {
  float acc = 0.0;
  for (uint w = 0u; w < hs4; w++) {
    int word = int(kc[kbase + w]);
    uint b = w * 4u;
    acc += s_q[b + 0u] * float(bitfieldExtract(word, 0, 8));
    acc += s_q[b + 1u] * float(bitfieldExtract(word, 8, 8));
    acc += s_q[b + 2u] * float(bitfieldExtract(word, 16, 8));
    acc += s_q[b + 3u] * float(bitfieldExtract(word, 24, 8));
  }
  return scale * uintBitsToFloat(kc[kbase + hs4]) * acc;
}
#else
float logit(uint kbase, uint unused) {
  float acc = 0.0;
  for (uint d = 0u; d < head_size; d++) { acc += s_q[d] * kc[kbase + d]; }
  return scale * acc;
}
#endif

void main() {
  uint head_idx = gl_WorkGroupID.x;
  uint seq_idx = gl_WorkGroupID.y;
  uint part = gl_WorkGroupID.z;
  uint tid = gl_LocalInvocationID.x;
  uint context_len = min(context_lens[seq_idx], max_context_len);
  uint s_base = ((seq_idx * num_heads + head_idx) * gl_NumWorkGroups.z + part) * 2u;
  uint t_begin = part * PARTITION;
  // Workgroup-uniform: partitions past the end hold no logits (the softmax kernel zeroes them).
  if (t_begin >= context_len) {
    if (tid == 0u) { stats[s_base] = -3.402823466e38; stats[s_base + 1u] = 0.0; }
    return;
  }
  uint t_end = min(t_begin + PARTITION, context_len);
  uint kv_head_idx = head_idx / (num_heads / num_kv_heads);
#ifdef KV_Q8
  uint hs4 = head_size / 4u;
  uint wpt = hs4 + 1u;
#else
  uint hs4 = 0u;
  uint wpt = head_size;
#endif
  uint head_stride = block_size * wpt;
  uint block_stride = num_kv_heads * head_stride;
  uint q_base = seq_idx * q_stride + head_idx * head_size;
  for (uint i = tid; i < head_size; i += WG) { s_q[i] = q[q_base + i]; }
  barrier();
  uint bt_base = seq_idx * max_num_blocks_per_seq;
  uint o_base = (seq_idx * num_heads + head_idx) * max_context_len;
  float local_max = -3.402823466e38;
  for (uint t = t_begin + tid; t < t_end; t += WG) {
    uint kbase = block_tables[bt_base + t / block_size] * block_stride + kv_head_idx * head_stride
               + (t % block_size) * wpt;
    float l = logit(kbase, hs4);
    o[o_base + t] = l;
    local_max = max(local_max, l);
  }
  s_red[tid] = local_max;
  barrier();
  for (uint s = WG / 2u; s > 0u; s >>= 1) {
    if (tid < s) { s_red[tid] = max(s_red[tid], s_red[tid + s]); }
    barrier();
  }
  float qk_max = s_red[0];
  barrier();
  float local_sum = 0.0;
  for (uint t = t_begin + tid; t < t_end; t += WG) { local_sum += exp(o[o_base + t] - qk_max); }
  s_red[tid] = local_sum;
  barrier();
  for (uint s = WG / 2u; s > 0u; s >>= 1) {
    if (tid < s) { s_red[tid] += s_red[tid + s]; }
    barrier();
  }
  if (tid == 0u) { stats[s_base] = qk_max; stats[s_base + 1u] = s_red[0]; }
}
