// Included text, not a function: sums red[0..lanes) into red[0] (a tree, strides lanes/2, ..., 1, each step one
// f32 add; `lanes` is the including entry point's workgroup size, a uniform let). With 256 lanes this is the
// order of kvviz/families/turboquant/format.py `tree_sum_lanes`; with 64 lanes and values only in lanes < 64 it gives the
// same bits (the 256-lane tree's first two steps add +0 to each of them: the values summed are squares, >= +0).
// The including entry point writes red[tid] first. Barriers at entry-point scope (see tree_sum.wgsl).
workgroupBarrier();
{
    var s = lanes / 2u;
    while s > 0u {
        if tid < s { red[tid] = red[tid] + red[tid + s]; }
        workgroupBarrier();
        s = s >> 1u;
    }
}
