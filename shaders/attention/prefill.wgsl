// Causal (chunked) prefill attention over kvviz's packed cache formats read in place: the f32 baseline cache, f16,
// int8 (the seed layout, which int8_token shares), FP8 E4M3 / E5M2 with a per-token, per-tensor or per-KV-head scale,
// int4 per group. kvviz/attention/prefill.py renders it for one format and shape: the load functions come from the
// template attention/prefill_formats.wgsl.j2, the kernel is attention/prefill_kernel.wgsl.
// Format: {{FORMAT}}.
@group(0) @binding(6) var<storage, read> tensor: array<u32>;  // per-tensor / per-head scales (f32 bits); unread otherwise

const WPT: u32 = {{WPT}}u;   // u32 words of one token's record

{{LOADERS}}


// #include "attention/prefill_kernel.wgsl"
