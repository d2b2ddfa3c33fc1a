"""The baseline's next-token distributions of a quality run, kept once per (model, text, chunking) on disk.

Every method of a run is compared with the same baseline (the f32 paged cache), so the baseline's pass
runs once and its distributions are stored in the user's cache folder ($KVVIZ_CACHE_DIR, else
$XDG_CACHE_HOME/kvviz, else ~/.cache/kvviz; then eval/<key>/), keyed by the model file's SHA-256, the token
ids, the chunking and the baseline's cache. A later run over the same model, text and chunking reads them
and costs one pass per method.

What is stored per scored position (as llama.cpp's --kl-divergence-base file does, more finely):
  logp     the log-probabilities of the whole vocabulary as 16-bit codes: code = round((log p - max log p +
           RANGE) / STEP), RANGE = 32 nats, STEP = RANGE / 65535 (1/2048 nat); log-probabilities more than
           RANGE below the row's largest take code 0. Read back, a row is renormalised (a distribution of its
           own: KL against it is >= 0) and `kld_floor` says how far it lies from the exact one (the mean
           KL(stored || exact) over the positions, measured when it was written).
  nll, top the exact -log p of the next token (float64) and the top token, from the float32 logits
  tokens   the next tokens; position and chunk of every row
The codes are a .npy file read through a memory map, one chunk's rows at a time.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvviz.errors import InvalidInput

RANGE = 32.0
STEP = RANGE / 65535.0
FORMAT = 1  # the layout of a stored baseline; a change makes a new key
ENV_DIR = "KVVIZ_CACHE_DIR"


def cache_root() -> Path:
    """$KVVIZ_CACHE_DIR, else $XDG_CACHE_HOME/kvviz, else ~/.cache/kvviz (the folder kvviz keeps caches in)."""
    own = os.environ.get(ENV_DIR)
    if own:
        return Path(own).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kvviz"


def eval_cache_dir() -> Path:
    return cache_root() / "eval"


def file_sha256(path, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(block)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


# exp(code * STEP - RANGE) of every code: a stored row's probabilities up to one factor a row, by one look-up a value
_CODE_PROB = np.exp(np.arange(65536, dtype=np.float64) * STEP - RANGE)


def shifted_logits(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(z, lse): z = logits - their row maximum, float64 [N, V]; lse = log sum exp z [N] (log p = z - lse)."""
    z = np.array(logits, np.float64)
    z -= z.max(axis=1, keepdims=True)
    return z, np.log(np.exp(z).sum(axis=1))


def kld_from_codes(codes: np.ndarray, z: np.ndarray, lse: np.ndarray) -> np.ndarray:
    """KL(stored rows || the distribution of logits) [N], from the codes [N, V] and shifted_logits' (z, lse), without
    decoding the stored rows: with w = exp(code * STEP - RANGE) and S = sum w, a stored row is p = w / S,
    log p = code * STEP - RANGE - log S (the row's maximum cancels), so
      KL = sum p (log p - (z - lse)) = sum w (code * STEP - z) / S - RANGE - log S + lse.
    The terms are of the size of a log-probability, so in float64 the difference keeps KL to about 1e-14."""
    w = _CODE_PROB[codes]
    S = w.sum(axis=1)
    d = codes * STEP
    d -= z
    return np.einsum("ij,ij->i", w, d) / S - RANGE - np.log(S) + lse


def encode(logp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes [N, V] uint16, row maxima [N] float64) of log-probabilities [N, V]."""
    lp = np.asarray(logp, np.float64)
    top = lp.max(axis=1, keepdims=True)
    c = np.rint((lp - top + RANGE) / STEP)
    return np.clip(c, 0, 65535).astype(np.uint16), top[:, 0]


def decode(codes: np.ndarray, top: np.ndarray) -> np.ndarray:
    """The stored rows as normalised float64 log-probabilities [N, V]."""
    return decode_with_probs(codes, top)[0]


def decode_with_probs(codes: np.ndarray, top: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log-probabilities, probabilities) [N, V] float64 of the stored rows, normalised (one exp pass)."""
    lp = np.asarray(codes, np.float64)
    lp *= STEP
    lp += (np.asarray(top, np.float64) - RANGE)[:, None]
    lp -= lp.max(axis=1, keepdims=True)
    p = np.exp(lp)
    s = p.sum(axis=1, keepdims=True)
    p /= s
    lp -= np.log(s)
    return lp, p


@dataclass
class BaseRows:
    """The baseline's rows of one chunk: codes and their row maxima, exact NLL and top token."""

    codes: np.ndarray
    top_logp: np.ndarray
    nll: np.ndarray
    top: np.ndarray


class BaselineStore:
    """The stored baseline of one (model, text, chunking): `meta` (JSON), and the arrays in `folder`."""

    ARRAYS = ("nll", "top", "tokens", "position", "chunk", "top_logp")

    def __init__(self, folder: Path, meta: dict, codes: np.ndarray, arrays: dict):
        self.folder = folder
        self.meta = meta
        self.codes = codes
        self.arrays = arrays

    @staticmethod
    def key(identity: dict) -> str:
        text = json.dumps(dict(identity, format=FORMAT), sort_keys=True, allow_nan=False)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    @classmethod
    def folder_of(cls, identity: dict, root: Path | None = None) -> Path:
        return (eval_cache_dir() if root is None else Path(root)) / cls.key(identity)

    @classmethod
    def open(cls, identity: dict, root: Path | None = None) -> "BaselineStore | None":
        """The stored baseline of `identity`, or None when there is none (or it is incomplete or unreadable:
        it is then computed again)."""
        folder = cls.folder_of(identity, root)
        try:
            meta = json.loads((folder / "meta.json").read_text())
            if meta.get("identity") != identity or not meta.get("complete"):
                return None
            codes = np.load(folder / "logp.npy", mmap_mode="r")
            with np.load(folder / "rows.npz") as z:
                arrays = {k: z[k] for k in cls.ARRAYS}
        except (OSError, ValueError, KeyError):
            return None
        if codes.shape[0] != arrays["nll"].size:
            return None
        return cls(folder, meta, codes, arrays)

    def rows(self, chunk: int, part: slice = slice(None)) -> tuple[np.ndarray, BaseRows]:
        """(row indices, BaseRows) of one chunk (of its rows `part`, counted from the chunk's first)."""
        idx = np.flatnonzero(self.arrays["chunk"] == chunk)[part]
        if idx.size == 0:
            raise InvalidInput(f"the stored baseline {self.folder} has no rows of chunk {chunk}")
        sl = slice(int(idx[0]), int(idx[-1]) + 1)
        a = self.arrays
        return idx, BaseRows(np.asarray(self.codes[sl]), a["top_logp"][sl], a["nll"][sl], a["top"][sl])

    @property
    def kld_floor(self) -> float:
        return float(self.meta.get("kld_floor", float("nan")))


class BaselineWriter:
    """Writes a baseline chunk by chunk into a temporary folder, renamed into place when complete (an
    interrupted run leaves no half baseline that a later run would read)."""

    def __init__(self, identity: dict, n_rows: int, vocab: int, info: dict, root: Path | None = None):
        self.identity = identity
        self.final = BaselineStore.folder_of(identity, root)
        self.tmp = self.final.with_name(self.final.name + f".part{os.getpid()}")
        try:
            self.tmp.mkdir(parents=True, exist_ok=True)
            self.codes = np.lib.format.open_memmap(self.tmp / "logp.npy", mode="w+", dtype=np.uint16,
                                                   shape=(n_rows, vocab))
        except OSError as exc:
            raise InvalidInput(f"cannot write the baseline's distributions under {self.tmp.parent}: {exc.strerror}",
                               f"Point {ENV_DIR} at a folder with room for {n_rows * vocab * 2 / 2**20:.0f} MiB.") \
                from None
        self.arrays = {"nll": np.zeros(n_rows, np.float64), "top": np.zeros(n_rows, np.int32),
                       "tokens": np.zeros(n_rows, np.int32), "position": np.zeros(n_rows, np.int32),
                       "chunk": np.zeros(n_rows, np.int32), "top_logp": np.zeros(n_rows, np.float64)}
        self.info = dict(info)
        self.n = 0
        self._floor = []

    def add(self, logits: np.ndarray, tokens: np.ndarray, position: np.ndarray, chunk: int) -> BaseRows:
        """Store one chunk's scored rows (their logits [n, V], or any log-probabilities of the same distributions);
        returns them as stored."""
        return self.put(self.encode_rows(logits, tokens, position, chunk))

    @staticmethod
    def encode_rows(logits: np.ndarray, tokens: np.ndarray, position: np.ndarray, chunk: int) -> dict:
        """What `put` stores of rows logits [n, V]: the arithmetic alone (no state), so that several blocks of rows
        can be encoded at once on other threads and stored in order. The codes come from z = logits - max (log p -
        max log p = z), the row's largest log p is -lse, and the stored rows' distance to the exact ones
        (kld_floor) from kld_from_codes."""
        n = logits.shape[0]
        z, lse = shifted_logits(logits)
        rows = np.arange(n)
        codes = np.clip(np.rint((z + RANGE) / STEP), 0, 65535).astype(np.uint16)
        stored = BaseRows(codes, -lse, lse - z[rows, tokens], np.argmax(z, axis=1).astype(np.int32))
        floor = kld_from_codes(codes, z, lse)
        return {"stored": stored, "tokens": tokens, "position": position, "chunk": chunk, "floor": floor}

    def put(self, enc: dict) -> BaseRows:
        """Store encoded rows (`encode_rows`) after the rows stored before them."""
        stored = enc["stored"]
        n = stored.codes.shape[0]
        sl = slice(self.n, self.n + n)
        self.codes[sl] = stored.codes
        a = self.arrays
        a["nll"][sl] = stored.nll
        a["top"][sl] = stored.top
        a["tokens"][sl] = enc["tokens"]
        a["position"][sl] = enc["position"]
        a["chunk"][sl] = enc["chunk"]
        a["top_logp"][sl] = stored.top_logp
        self._floor.append(enc["floor"])
        self.n += n
        return stored

    def finish(self) -> BaselineStore:
        if self.n != self.codes.shape[0]:
            raise InvalidInput(f"the baseline has {self.n} of its {self.codes.shape[0]} rows")
        self.codes.flush()
        del self.codes
        np.savez(self.tmp / "rows.npz", **self.arrays)
        floor = np.concatenate(self._floor) if self._floor else np.zeros(0)
        meta = dict(self.info, identity=self.identity, complete=True, rows=self.n, format=FORMAT,
                    code_range_nats=RANGE, code_step_nats=STEP, kld_floor=float(floor.mean()) if floor.size else 0.0,
                    kld_floor_max=float(floor.max()) if floor.size else 0.0,
                    created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        (self.tmp / "meta.json").write_text(json.dumps(meta, indent=1, allow_nan=False))
        if self.final.exists():
            shutil.rmtree(self.final, ignore_errors=True)
        os.replace(self.tmp, self.final)
        store = BaselineStore.open(self.identity, self.final.parent)
        if store is None:
            raise InvalidInput(f"the baseline written to {self.final} cannot be read back")
        return store

    def abandon(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
