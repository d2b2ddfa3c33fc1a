"""Write a llama GGUF of random weights in any shape: the models the GPU forward's benchmarks run
(tools/forward_bench.py). Defaults: Llama-3-8B's shapes (32 layers, hidden 4096, 32 query / 8 KV heads of 128,
feed-forward 14336, vocabulary 128256, RoPE base 500000), weights in f16 (16 GB; --type f32 doubles it).

    python tools/random_gguf.py OUT.gguf [--layers N] [--hidden H] [--heads N] [--kv-heads N] [--head-size D]
                                         [--ffn F] [--vocab V] [--context N] [--type f16|f32] [--seed S]

Weights are N(0, 1/fan_in) (a matrix's products keep the activations' scale), norms 1. The tensors are generated
and written one at a time (memory: the largest tensor). The vocabulary is byte-level BPE as kvviz reads it: the 256
byte symbols, a few merges, the rest reserved control tokens; benchmarks feed token ids, not text.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - the tool's dependency, named
    sys.exit("random_gguf.py needs the gguf package (pip install gguf)")

from kvviz.sources.random_gguf import byte_chars  # the small fixtures' generator: one byte table


MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]


def vocabulary(size: int) -> tuple[list[str], list[int]]:
    """(tokens, token types): specials, the byte symbols, the merges' results, reserved control tokens."""
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    tokens = specials + byte_chars() + [m.replace(" ", "") for m in MERGES]
    if size < len(tokens):
        sys.exit(f"--vocab must be at least {len(tokens)}")
    types = [3] * len(specials) + [1] * (len(tokens) - len(specials))
    tokens += [f"<|reserved_{i}|>" for i in range(size - len(tokens))]
    types += [3] * (size - len(types))
    return tokens, types


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-size", type=int, default=128)
    ap.add_argument("--ffn", type=int, default=14336)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--rope-theta", type=float, default=500000.0)
    ap.add_argument("--type", choices=("f16", "f32"), default="f16")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    dt = np.float16 if a.type == "f16" else np.float32
    h, d, nq, nkv, f = a.hidden, a.head_size, a.heads * a.head_size, a.kv_heads * a.head_size, a.ffn
    shapes = [("token_embd.weight", (a.vocab, h))]
    for i in range(a.layers):
        b = f"blk.{i}."
        shapes += [(b + "attn_norm.weight", (h,)), (b + "attn_q.weight", (nq, h)), (b + "attn_k.weight", (nkv, h)),
                   (b + "attn_v.weight", (nkv, h)), (b + "attn_output.weight", (h, nq)), (b + "ffn_norm.weight", (h,)),
                   (b + "ffn_gate.weight", (f, h)), (b + "ffn_up.weight", (f, h)), (b + "ffn_down.weight", (h, f))]
    shapes += [("output_norm.weight", (h,)), ("output.weight", (a.vocab, h))]

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name(f"random llama {a.layers}x{h}, {a.heads}/{a.kv_heads} heads of {d}, ffn {f}")
    w.add_block_count(a.layers)
    w.add_context_length(a.context)
    w.add_embedding_length(h)
    w.add_feed_forward_length(f)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_key_length(d)
    w.add_value_length(d)
    w.add_rope_freq_base(a.rope_theta)
    w.add_layer_norm_rms_eps(1e-5)
    tokens, types = vocabulary(a.vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    item = np.dtype(dt).itemsize
    for name, shape in shapes:
        # norms stay f32, as llama.cpp's converter writes them
        w.add_tensor_info(name, shape, np.dtype(np.float32 if len(shape) == 1 else dt),
                          int(np.prod(shape)) * (4 if len(shape) == 1 else item))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(a.seed)
    t0, total = time.time(), 0
    for name, shape in shapes:
        if len(shape) == 1:
            t = np.ones(shape, np.float32)
        else:
            t = np.empty(shape, dt)
            scale = np.float32(1.0 / np.sqrt(shape[1]))
            for r in range(0, shape[0], 4096):  # bounded f32 temporaries
                t[r:r + 4096] = rng.standard_normal((min(4096, shape[0] - r), shape[1]), np.float32) * scale
        w.write_tensor_data(t)
        total += t.nbytes
    w.close()
    print(f"wrote {a.out}: {len(shapes)} tensors, {total / 2**30:.2f} GiB in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
