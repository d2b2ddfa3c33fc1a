// Included text, not a function: sums red[0..128) into red[0] (a tree, strides 64, 32, ..., 1, each
// step one f32 add; kvviz/families/turboquant/format.py `tree_sum_f32` is the same order). The including
// entry point writes red[tid] first. Barriers must stay at entry-point scope: naga's SPIR-V path
// miscompiles workgroupBarrier() reached through a function call inside a loop (docs/kernels.md,
// "TurboQuant"), so this is pasted in by `// #include`.
workgroupBarrier();
if tid < 64u { red[tid] = red[tid] + red[tid + 64u]; }
workgroupBarrier();
if tid < 32u { red[tid] = red[tid] + red[tid + 32u]; }
workgroupBarrier();
if tid < 16u { red[tid] = red[tid] + red[tid + 16u]; }
workgroupBarrier();
if tid < 8u { red[tid] = red[tid] + red[tid + 8u]; }
workgroupBarrier();
if tid < 4u { red[tid] = red[tid] + red[tid + 4u]; }
workgroupBarrier();
if tid < 2u { red[tid] = red[tid] + red[tid + 2u]; }
workgroupBarrier();
if tid < 1u { red[tid] = red[tid] + red[tid + 1u]; }
workgroupBarrier();
