// ---- shaders/turboquant/fast_common.wgsl: the TurboQuant decodes' code helpers (fast/decode_tq*.wgsl) --------------
const PW: u32 = {{PW}}u;     // polar words of one vector (16 codes a word)
const JW: u32 = {{JW}}u;     // QJL words of one key (32 bits a word)
const WPL: u32 = {{WPL}}u;   // polar words per lane

// 4 two-bit codes -> their centroids
fn cents(i: vec4<u32>, c0: vec4<f32>, c1: vec4<f32>, c2: vec4<f32>, c3: vec4<f32>) -> vec4<f32> {
  return select(select(c0, c1, i == vec4<u32>(1u)), select(c2, c3, i == vec4<u32>(3u)), i >= vec4<u32>(2u));
}

// x * (2 bit - 1): `m` is the f32 sign bit where the QJL bit is 0 (computed once per token, shared by the G heads)
fn flip(x: vec4<f32>, m: vec4<u32>) -> vec4<f32> {
  return bitcast<vec4<f32>>(bitcast<vec4<u32>>(x) ^ m);
}
// ---- end of tq_common.wgsl ---------------------------------------------------------------------------------
