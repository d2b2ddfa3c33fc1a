// ---- shaders/attention/split_common.wgsl: what every split-K decode shares --------
// (the {{...}} values come from each decode's render(), its code blocks from its *.wgsl.j2 template)
const D: u32 = {{D}}u;       // head size (the padded one for KIVI)
const L: u32 = {{L}}u;       // lanes sharing a token row
const RG: u32 = {{RG}}u;     // row groups of a workgroup
const U: u32 = {{U}}u;       // tokens a row group takes per step
const DPL: u32 = {{DPL}}u;   // dims (channels) per lane
const STRIDE: u32 = {{STRIDE}}u;  // floats of one (head) state in workgroup memory / partials: m, l, acc[D]
const EMPTY: f32 = -1.0e30;   // m of a state that has seen no token (finite: exp2(EMPTY - m) = 0, never NaN)
const MASKED: f32 = -3.0e38;  // logit of a step's token outside the partition
var<workgroup> sh: array<f32, {{SHARED}}>;
// ---- end of split_common.wgsl ------------------------------------------------------------------------------
