// Included text, not a function: the unnormalised Walsh-Hadamard transform of rot[0..head_dim) in
// place, butterflies (a+b, a-b) at strides 1, 2, 4, ..., then a barrier. The including entry point
// writes rot first. Pasted in by `// #include` so its barriers stay at entry-point scope (see
// tree_sum.wgsl).
{
    var stride = 1u;
    while stride < head_dim {
        workgroupBarrier();
        if tid < head_dim / 2u {
            let i = (tid / stride) * 2u * stride + (tid % stride);
            let a = rot[i];
            let b = rot[i + stride];
            rot[i] = a + b;
            rot[i + stride] = a - b;
        }
        stride = stride * 2u;
    }
}
workgroupBarrier();
