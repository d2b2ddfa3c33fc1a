// Causal (chunked) prefill attention over a TurboQuant cache read in place (any setting: bits, the outlier split, the
// QJL scale; the seed configuration's records are the general compressor's): a tile's records become its K / V values
// in workgroup memory, rotated back there with the dequantiser's arithmetic (the kernel's K_TILE / V_TILE code, from
// turboquant/prefill.wgsl.j2), and the kernel attention/prefill_kernel.wgsl attends over them. kvviz/attention/prefill.py plans it.
@group(0) @binding(6) var<storage, read> chans: array<u32>;      // [2 (K, V), kv_heads, D] channel of each coordinate
@group(0) @binding(7) var<storage, read> signs: array<f32>;      // every instance's [polar (P) | jl (P)] signs
@group(0) @binding(8) var<storage, read> codebook: array<f32>;   // every instance's [centroids | boundaries]

const WPK: u32 = {{WPK}}u;     // words of a key record
const WPV: u32 = {{WPV}}u;     // words of a value record
const PMAX: u32 = {{PMAX}}u;   // the largest rotation: floats of scr a key
var<workgroup> scr: array<f32, {{SCR}}>;   // a tile's rotated vectors, PMAX a key

// kvs is filled by K_TILE / V_TILE, every channel of every key
fn load_k4(t: TokenAt, c: u32) -> vec4<f32> { return vec4<f32>(0.0); }
fn load_v4(t: TokenAt, c: u32) -> vec4<f32> { return vec4<f32>(0.0); }

// the first word of the record of the tile's key j
fn tile_rec(tile: TileAt, j: u32, words: u32) -> u32 {
  let kp = tile.k0 + j;
  return ((block_tables[tile.bt + kp / BSZ] * p.num_kv_heads + tile.h) * BSZ + kp % BSZ) * words;
}

// #include "attention/prefill_kernel.wgsl"
