// Included text, not a function: sums red[0..256) into red[0] (a tree, strides 128, 64, ..., 1, each step
// one f32 add; kvviz/formats/turboquant.py `tree_sum_lanes` is the same order). The including entry point
// writes red[tid] first (256 lanes). Barriers at entry-point scope (see tree_sum.wgsl).
workgroupBarrier();
if tid < 128u { red[tid] = red[tid] + red[tid + 128u]; }
// #include "turboquant/tree_sum.wgsl"
