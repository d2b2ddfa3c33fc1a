// ---- shaders/common/write_redo.wgsl: the rare exact pass of a fast writer whose record holds one code word a vec4
// (int8/write_fast.wgsl, fp8/write_fast.wgsl). Their main loop writes every word from the branch-free
// fast_codes(x, inv) -> (word, 1 when sure); a lane with an unsure word then calls redo_unsure, which redoes
// those words through the writer's exact codes(x, scale, inv), K then V, the vec4s reloaded (a loop, not
// unrolled: one copy of the exact path in the shader). n: the lane's vec4s (NV, fewer for a padded lane split).
fn redo_unsure(src: u32, dst: u32, n: u32, sk: f32, ik: f32, sv: f32, iv: f32) {
  for (var j = 0u; j < 2u * n; j = j + 1u) {
    let isv = j >= n;
    let o = (j % n) * L;
    var x: vec4<f32>;
    var s = sk;
    var inv = ik;
    if (isv) { x = val_in[src + o]; s = sv; inv = iv; } else { x = key_in[src + o]; }
    if (fast_codes(x, inv).y == 1u) { continue; }
    let w = codes(x, s, inv);
    if (isv) { v_cache[dst + o] = w; } else { k_cache[dst + o] = w; }
  }
}
// ---- end of write_redo.wgsl
