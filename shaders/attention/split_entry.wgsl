  // ---- shaders/attention/split_entry.wgsl: where a paged split-K decode's invocation works (fast/decode_*.wgsl,
  // included first in the entry point): partition x KV head x sequence of the grid, its lane and row group,
  // the partition's tokens [t0, t1), its query heads' first dim qb and its block-table row bt.
  let part = wid.x;
  let kvh = wid.y;
  let seq = wid.z;
  let lane = li % L;
  let rg = li / L;
  let t0 = part * p.partition_tokens;
  let t1 = min(context_lens[seq], t0 + p.partition_tokens);
  let qb = (seq * p.num_heads + kvh * {{G}}u) * D + lane * DPL;
  let bt = seq * p.max_blocks;
  // ---- end of split_entry.wgsl
