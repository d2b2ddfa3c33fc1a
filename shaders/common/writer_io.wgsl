// The per-token writers' inputs and caches (int8_write, int4_write, fp8_write include this):
// key/value rows [rows, kv_heads, head_size] f32, their slots [rows] u32 (PAD_SLOT: a padding row),
// the K and V caches as u32 words, the immediates, and the K|V accessors (grid z: 0 = K, 1 = V).
@group(0) @binding(0) var<storage, read> key_in: array<f32>;
@group(0) @binding(1) var<storage, read> val_in: array<f32>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<u32>;
struct P { kvh: u32, hd: u32, bs: u32, wpt: u32 }
var<immediate> p: P;
const WG: u32 = 64u;

fn load_x(which: u32, i: u32) -> f32 { if (which == 0u) { return key_in[i]; } return val_in[i]; }
fn store_w(which: u32, i: u32, w: u32) { if (which == 0u) { k_cache[i] = w; } else { v_cache[i] = w; } }
