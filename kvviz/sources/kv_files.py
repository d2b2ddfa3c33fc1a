"""KV dump files: load and save a model's cached keys/values (and optionally its queries).

Convention (every format):
  k           [layers, kv_heads, tokens, head_size]   required, keys after RoPE (what a KV cache holds)
  v           [layers, kv_heads, tokens, head_size]   required, same shape as k
  q           [layers, heads,    tokens, head_size]   optional, heads a multiple of kv_heads
  k_pre_rope  [layers, kv_heads, tokens, head_size]   optional, keys before RoPE
  tokens      [tokens] integer ids                   optional
Tensors are float32, float16 or bfloat16 (float64 is accepted and rounded to float32); every value must be
finite. Loaded tensors are returned as float32 (exact for float16/bfloat16); the stored dtype is reported.

Formats, chosen by the file extension:
  .safetensors  read/write; bfloat16 supported; token strings and the model config go in the text metadata
                (keys "token_strings" and "config", JSON).
  .npz          read/write, never unpickled; token strings as a unicode array "token_strings". numpy cannot
                store bfloat16 in .npz (it comes back as raw 2-byte records), so bfloat16 is refused there.
  .pt / .pth    read only, with torch.load(weights_only=True): a dict of plain tensors. Anything else in
                the pickle is refused, never executed. Needs PyTorch.
"""
from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from kvviz.errors import InvalidInput, check_finite

CONVENTION = (
    "Expected arrays 'k' and 'v' of shape [layers, kv_heads, tokens, head_size] (optional 'q' "
    "[layers, heads, tokens, head_size], 'k_pre_rope' like 'k', 'tokens' [tokens]) in float32, float16 or "
    "bfloat16, stored as .safetensors, .npz or .pt."
)
_TENSOR_KEYS = ("k", "v", "q", "k_pre_rope")
_DTYPES = ("float32", "float16", "bfloat16")


@dataclass
class KVDump:
    k: np.ndarray  # float32 [L, n_kv, T, D]
    v: np.ndarray  # float32 [L, n_kv, T, D]
    q: np.ndarray | None = None  # float32 [L, n_heads, T, D]
    k_pre_rope: np.ndarray | None = None
    tokens: np.ndarray | None = None  # int64 [T]
    token_strings: list[str] | None = None
    source_dtype: str = "float32"
    metadata: dict[str, str] = field(default_factory=dict)
    path: Path | None = None

    @property
    def n_layers(self) -> int:
        return self.k.shape[0]

    @property
    def n_kv_heads(self) -> int:
        return self.k.shape[1]

    @property
    def n_tokens(self) -> int:
        return self.k.shape[2]

    @property
    def head_size(self) -> int:
        return self.k.shape[3]


def _bfloat16():
    """ml_dtypes' bfloat16, imported when a file needs it (ml_dtypes is slow to load: not at start-up)."""
    import ml_dtypes

    return ml_dtypes.bfloat16


def _bad(source: str, what: str) -> InvalidInput:
    return InvalidInput(f"{source}: {what}", CONVENTION)


_F32_MAX = float(np.finfo(np.float32).max)


def _to_f32(source: str, name: str, a: np.ndarray) -> tuple[np.ndarray, str]:
    a = np.asarray(a)
    if a.dtype.name == "bfloat16":  # ml_dtypes' type, told by its name (no import of ml_dtypes for a float32 file)
        return a.astype(np.float32), "bfloat16"
    if a.dtype.kind == "f" and not a.dtype.isnative:  # big-endian floats (an .npz written on such a machine)
        a = a.astype(a.dtype.newbyteorder("="))
    if a.dtype == np.float64:
        # float64 is rounded to float32: a finite value beyond float32's range would become Inf in the cast
        check_finite(f"{source}: '{name}'", a)
        peak = float(np.max(np.abs(a))) if a.size else 0.0
        if peak > _F32_MAX:
            raise InvalidInput(f"{source}: '{name}' is float64 with values up to {peak:.3g}, beyond float32's range "
                               f"(+-{_F32_MAX:.3g}), and kvviz computes in float32",
                               "Scale the tensor down before saving it (check the dump's units), or store it as "
                               "float32.")
        return a.astype(np.float32), "float64"
    if a.dtype in (np.float32, np.float16):
        return a.astype(np.float32), a.dtype.name
    if a.dtype.kind == "V" and a.dtype.itemsize == 2:
        raise _bad(source, f"'{name}' holds raw 2-byte records (bfloat16 saved to .npz?); "
                           "store bfloat16 in .safetensors or convert to float16/float32")
    if a.dtype.kind == "f":
        raise _bad(source, f"'{name}' has dtype {a.dtype}, a floating-point type kvviz does not read")
    raise _bad(source, f"'{name}' has dtype {a.dtype}, not a floating-point type")


def validate_kv(arrays: Mapping[str, np.ndarray], source: str = "KV data", *,
                token_strings: list[str] | None = None, metadata: Mapping[str, str] | None = None,
                path: Path | None = None) -> KVDump:
    """Check `arrays` against the convention and return them as a float32 KVDump."""
    missing = [n for n in ("k", "v") if n not in arrays]
    if missing:
        raise _bad(source, f"missing {' and '.join(repr(m) for m in missing)} (found: "
                           f"{', '.join(sorted(arrays)) or 'nothing'})")
    out: dict[str, np.ndarray] = {}
    dtypes = set()
    for name in _TENSOR_KEYS:
        if name not in arrays:
            continue
        a, dt = _to_f32(source, name, arrays[name])
        dtypes.add(dt)
        if a.ndim != 4:
            raise _bad(source, f"'{name}' has rank {a.ndim} (shape {tuple(a.shape)}), expected 4 "
                               "[layers, heads, tokens, head_size]")
        if 0 in a.shape:
            raise _bad(source, f"'{name}' is empty (shape {tuple(a.shape)})")
        check_finite(f"{source}: '{name}'", a)
        out[name] = a
    k, v = out["k"], out["v"]
    if k.shape != v.shape:
        raise _bad(source, f"'k' {tuple(k.shape)} and 'v' {tuple(v.shape)} differ in shape")
    L, nkv, T, D = k.shape
    if "k_pre_rope" in out and out["k_pre_rope"].shape != k.shape:
        raise _bad(source, f"'k_pre_rope' {tuple(out['k_pre_rope'].shape)} differs from 'k' {tuple(k.shape)}")
    if "q" in out:
        ql, qh, qt, qd = out["q"].shape
        if (ql, qt, qd) != (L, T, D) or qh % nkv:
            raise _bad(source, f"'q' {tuple(out['q'].shape)} does not match 'k' {tuple(k.shape)} "
                               "(same layers, tokens and head_size; heads a multiple of kv_heads)")
    tokens = None
    if "tokens" in arrays:
        tokens = np.asarray(arrays["tokens"])
        if tokens.dtype.kind not in "iu" or tokens.shape != (T,):
            raise _bad(source, f"'tokens' must be {T} integer ids, got {tokens.dtype} {tuple(tokens.shape)}")
        tokens = tokens.astype(np.int64)
    if token_strings is not None and len(token_strings) != T:
        raise _bad(source, f"{len(token_strings)} token strings for {T} tokens")
    return KVDump(k=k, v=v, q=out.get("q"), k_pre_rope=out.get("k_pre_rope"), tokens=tokens,
                  token_strings=None if token_strings is None else [str(s) for s in token_strings],
                  source_dtype="/".join(sorted(dtypes)), metadata=dict(metadata or {}), path=path)


# ----------------------------------------------------------------------------------------------
# safetensors


_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32,
              "U32": np.uint32, "I16": np.int16, "U16": np.uint16, "I8": np.int8, "U8": np.uint8}


def _read_safetensors_raw(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Plain reader of the safetensors layout (u64 header size, JSON header, data), used when the installed
    safetensors cannot hand bfloat16 to numpy."""
    data = path.read_bytes()
    if len(data) < 8:
        raise _bad(path.name, "file too short for a safetensors header")
    (n,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8 : 8 + n])
    except ValueError as e:
        raise _bad(path.name, f"unreadable safetensors header ({e})") from e
    meta = header.pop("__metadata__", None) or {}
    arrays = {}
    base = 8 + n
    for name, info in header.items():
        dt = _bfloat16() if info["dtype"] == "BF16" else _ST_DTYPES.get(info["dtype"])
        if dt is None:
            raise _bad(path.name, f"tensor '{name}' has unsupported safetensors dtype {info['dtype']}")
        lo, hi = info["data_offsets"]
        arrays[name] = np.frombuffer(data[base + lo : base + hi], dtype=np.dtype(dt).newbyteorder("<")) \
            .reshape(info["shape"])
    return arrays, meta


def _write_safetensors_raw(path: Path, arrays: Mapping[str, np.ndarray], meta: Mapping[str, str]) -> None:
    names = {np.dtype(v): k for k, v in _ST_DTYPES.items()}
    names[np.dtype(_bfloat16())] = "BF16"
    header: dict = {"__metadata__": dict(meta)} if meta else {}
    blobs, off = [], 0
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        b = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    h += b" " * (-len(h) % 8)  # the format pads the header to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def _load_safetensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    try:
        with safe_open(str(path), framework="np") as f:
            meta = f.metadata() or {}
            return {k: f.get_tensor(k) for k in f.keys()}, meta
    except (KeyError, TypeError, ValueError):
        pass  # older safetensors: no numpy bfloat16; read the simple format directly
    except Exception as e:  # SafetensorError for corrupt files
        raise _bad(path.name, f"not a readable safetensors file ({e})") from e
    try:
        return _read_safetensors_raw(path)
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # malformed header entries
        raise _bad(path.name, f"not a readable safetensors file ({e!r})") from e


# ----------------------------------------------------------------------------------------------
# npz / pt


def _load_npz(path: Path) -> tuple[dict[str, np.ndarray], list[str] | None]:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except ValueError as e:  # object arrays need pickle: refused
        raise _bad(path.name, f"refused: the .npz holds pickled objects ({e})") from e
    except Exception as e:
        raise _bad(path.name, f"not a readable .npz file ({e})") from e
    strings = arrays.pop("token_strings", None)
    return arrays, None if strings is None else [str(s) for s in strings.tolist()]


def _load_pt(path: Path) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError as e:
        raise InvalidInput(
            f"{path.name}: reading .pt files requires PyTorch, which is not installed",
            "pip install torch, or convert the dump to .safetensors / .npz (" + CONVENTION + ")",
        ) from e
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # UnpicklingError when the pickle holds anything but tensors/containers
        raise _bad(path.name, f"refused: not a plain-tensor file loadable with weights_only=True ({e})") from e
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
        raise _bad(path.name, f"expected a dict of named tensors, got {type(obj).__name__}")
    arrays = {}
    for k, t in obj.items():
        if not isinstance(t, torch.Tensor):
            raise _bad(path.name, f"entry '{k}' is a {type(t).__name__}, not a tensor")
        t = t.detach().cpu()
        if t.dtype == torch.bfloat16:
            arrays[k] = t.view(torch.int16).numpy().view(_bfloat16())
        else:
            arrays[k] = t.numpy()
    return arrays


# ----------------------------------------------------------------------------------------------
# public API


def load_kv(path: str | Path) -> KVDump:
    """Load a KV dump (.safetensors, .npz, .pt/.pth) and validate it against the convention."""
    path = Path(path)
    ext = path.suffix.lower()
    if ext not in (".safetensors", ".npz", ".pt", ".pth"):
        raise _bad(path.name, f"unknown extension {ext or '(none)'!r}")
    if not path.is_file():
        raise InvalidInput(f"KV file not found: {path}", CONVENTION)
    strings, meta = None, {}
    if ext == ".safetensors":
        arrays, meta = _load_safetensors(path)
        if "token_strings" in meta:
            try:
                strings = [str(s) for s in json.loads(meta["token_strings"])]
            except ValueError as e:
                raise _bad(path.name, f"metadata 'token_strings' is not a JSON list ({e})") from e
    elif ext == ".npz":
        arrays, strings = _load_npz(path)
    else:
        arrays = _load_pt(path)
    return validate_kv(arrays, path.name, token_strings=strings, metadata=meta, path=path)


def save_kv(path: str | Path, k: np.ndarray, v: np.ndarray, q: np.ndarray | None = None, *,
            k_pre_rope: np.ndarray | None = None, tokens: np.ndarray | None = None,
            token_strings: list[str] | None = None, dtype: str = "float32",
            metadata: Mapping[str, str] | None = None) -> Path:
    """Validate and write a KV dump as .safetensors or .npz in `dtype` (float32, float16, bfloat16)."""
    path = Path(path)
    ext = path.suffix.lower()
    if ext not in (".safetensors", ".npz"):
        raise InvalidInput(f"{path.name}: can only save .safetensors or .npz, not {ext or '(none)'!r}", CONVENTION)
    if dtype not in _DTYPES:
        raise InvalidInput(f"dtype {dtype!r} not one of {', '.join(_DTYPES)}", CONVENTION)
    if ext == ".npz" and dtype == "bfloat16":
        raise InvalidInput(f"{path.name}: .npz cannot store bfloat16", "Save bfloat16 dumps as .safetensors.")
    arrays = {"k": k, "v": v}
    if q is not None:
        arrays["q"] = q
    if k_pre_rope is not None:
        arrays["k_pre_rope"] = k_pre_rope
    if tokens is not None:
        arrays["tokens"] = np.asarray(tokens)
    dump = validate_kv(arrays, path.name, token_strings=token_strings)
    target = np.dtype(_bfloat16()) if dtype == "bfloat16" else np.dtype(dtype)
    with np.errstate(over="ignore"):  # overflow is reported below, with the tensor's name
        out = {n: np.ascontiguousarray(getattr(dump, n).astype(target))
               for n in _TENSOR_KEYS if getattr(dump, n) is not None}
    for n, a in out.items():  # float16 overflows to Inf: refuse rather than write a poisoned file
        check_finite(f"{path.name}: '{n}' in {dtype}", a.astype(np.float32))
    if dump.tokens is not None:
        out["tokens"] = dump.tokens
    path.parent.mkdir(parents=True, exist_ok=True)
    if ext == ".safetensors":
        meta = {str(a): str(b) for a, b in (metadata or {}).items()}
        meta["layout"] = "k,v,k_pre_rope: [layers, kv_heads, tokens, head_size]; q: [layers, heads, tokens, head_size]"
        if dump.token_strings is not None:
            meta["token_strings"] = json.dumps(dump.token_strings, ensure_ascii=False, allow_nan=False)

        try:
            save_file(out, str(path), metadata=meta)
        except (KeyError, TypeError, ValueError, AttributeError):
            _write_safetensors_raw(path, out, meta)  # older safetensors without numpy bfloat16
    else:
        if dump.token_strings is not None:
            out["token_strings"] = np.array(dump.token_strings, dtype=str)
        np.savez(path, **out)
    return path


def capture_to_kv(capture) -> dict[str, np.ndarray]:
    """The arrays of a llama_numpy.Capture under the convention's names."""
    return {"k": capture.k, "v": capture.v, "q": capture.q, "k_pre_rope": capture.k_pre_rope,
            "tokens": np.asarray(capture.tokens, dtype=np.int64)}


def save_capture(capture, path: str | Path, dtype: str = "float32") -> Path:
    """Write a Capture (tensors, token ids, token strings; config in the safetensors metadata)."""
    arrays = capture_to_kv(capture)
    meta = {"config": json.dumps(asdict(capture.config), allow_nan=False), "start_pos": str(capture.start_pos)}
    return save_kv(path, arrays["k"], arrays["v"], arrays["q"], k_pre_rope=arrays["k_pre_rope"],
                   tokens=arrays["tokens"], token_strings=list(capture.token_strings), dtype=dtype, metadata=meta)
