// ---- shaders/attention/split_loop.wgsl: the body every split-K decode template (fast/decode_*.wgsl) ends its entry
// point with, included inside it: the generated prologue, the token loop, the row groups' merge, the write.
{{PROLOGUE}}
  // Every row group runs the same number of steps (uniform control flow for the shuffles);
  // tokens past t1 are clamped for the loads and masked in the logit.
  for (var tb = t0; tb < t1; tb = tb + RG * U) {
{{STEP}}
  }
  // Merge the row groups: a tree over workgroup memory, all heads at once.
{{MERGE}}
  {{SG_GUARD}}
  if (rg == 0u) {
{{WRITE}}
  }
// ---- end of split_loop.wgsl
