"""The host side of a `Results`, saved to one .npz file and read back without the GPU or a recompute.

What the window draws from a compute (the K/V/Q, the batch, both caches' outputs and weights, the
codes and scales read back, the metrics, every timing with its samples) is kept; the device objects
(the method's GPU caches) are not, so what needs them (the block inspector reading a cache's words)
asks for a new run. The file holds the arrays and one JSON document (`meta`) that names every other
value by type: only the types listed in `_TYPES` are rebuilt, and numpy never unpickles (allow_pickle
is off), so opening a snapshot from a report folder runs no code from it.

The run history keeps one per explicit window run (kvviz/history/db.py), and every report folder has
one (results.npz), so either reopens in the window as it was computed.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile

import numpy as np

from kvviz.methods.base import batch_layouts
from kvviz.analysis.session import Results, SessionConfig, TimingRow
from kvviz.errors import InvalidInput
from kvviz.families.registry import get_method
from kvviz.gpu.runtime import AdapterSummary
from kvviz.gpu.timing import TimingResult
from kvviz.methods.base import QuantizedKV
from kvviz.metrics import AttentionMetrics, CodeStats, Statistic
from kvviz.paging import PagedBatch
from kvviz.tables import clean

FORMAT = "kvviz-results"
VERSION = 1
FILE_NAME = "results.npz"


class SnapshotError(InvalidInput):
    """A results file that cannot be read back (missing, not a kvviz results file, a newer version, damaged)."""

    hint = "Compute the run again (Run, F5), or open another run or report."


def _types() -> dict:
    return {c.__name__: c for c in (Results, SessionConfig, TimingRow, AdapterSummary, TimingResult, QuantizedKV,
                                    AttentionMetrics, CodeStats, Statistic, PagedBatch)}


# fields rebuilt from others rather than stored: the method (from its id and options), the layouts (from the
# method and the batch), the device objects
# a timing row's dispatches hold kernel objects (GPU pipelines): a stored run keeps its timings, not its kernels
_SKIP = {"Results": {"method", "layouts", "stored_as"}, "QuantizedKV": {"method", "device"},
         "TimingRow": {"dispatches"}}


class _Writer:
    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}

    def enc(self, v, path: str):
        if isinstance(v, np.ndarray):
            if v.dtype == object:
                return self.enc(v.tolist(), path)
            key = f"a{len(self.arrays)}"
            self.arrays[key] = np.ascontiguousarray(v)
            return {"$array": key}
        if isinstance(v, (bool, np.bool_)):
            return bool(v)
        if isinstance(v, (int, np.integer)):
            return int(v)
        if isinstance(v, (float, np.floating)):
            f = float(v)
            return f if math.isfinite(f) else {"$float": repr(f)}  # strict JSON: nan, inf as text
        if v is None or isinstance(v, str):
            return v
        if dataclasses.is_dataclass(v) and type(v).__name__ in _TYPES_NAMES:
            name = type(v).__name__
            skip = _SKIP.get(name, set())
            return {"$type": name, "fields": {f.name: self.enc(getattr(v, f.name), f"{path}.{f.name}")
                                              for f in dataclasses.fields(v) if f.name not in skip}}
        if isinstance(v, tuple):
            return {"$tuple": [self.enc(x, f"{path}[{i}]") for i, x in enumerate(v)]}
        if isinstance(v, list):
            return [self.enc(x, f"{path}[{i}]") for i, x in enumerate(v)]
        if isinstance(v, dict):
            items = [(k, x) for k, x in v.items() if _storable(x)]
            return {"$dict": [[self.enc(k, path), self.enc(x, f"{path}[{k!r}]")] for k, x in items]}
        raise TypeError(f"{path}: a {type(v).__name__} cannot be stored in a results file")


_TYPES_NAMES = {"Results", "SessionConfig", "TimingRow", "AdapterSummary", "TimingResult", "QuantizedKV",
                "AttentionMetrics", "CodeStats", "Statistic", "PagedBatch"}


def _storable(x) -> bool:
    """What a dict of method extras may hold that is kept (host arrays and plain values, not GPU objects)."""
    if isinstance(x, (np.ndarray, bool, int, float, str, np.generic)) or x is None:
        return True
    if isinstance(x, (list, tuple)):
        return all(_storable(y) for y in x)
    if isinstance(x, dict):
        return all(_storable(y) for y in x.values())
    return dataclasses.is_dataclass(x) and type(x).__name__ in _TYPES_NAMES


class _Obj:
    """A stored dataclass before it is built: its class (from `_types`) and its decoded fields."""

    def __init__(self, cls, fields):
        self.cls, self.fields = cls, fields


class _Reader:
    def __init__(self, arrays, types):
        self.arrays, self.types = arrays, types

    def dec(self, v):
        if isinstance(v, list):
            return [self.dec(x) for x in v]
        if not isinstance(v, dict):
            return v
        if "$array" in v:
            return self.arrays[v["$array"]]
        if "$float" in v:
            return float(v["$float"])
        if "$tuple" in v:
            return tuple(self.dec(x) for x in v["$tuple"])
        if "$dict" in v:
            return {_hashable(self.dec(k)): self.dec(x) for k, x in v["$dict"]}
        if "$type" in v:
            cls = self.types.get(v["$type"])
            if cls is None:
                raise SnapshotError(f"unknown stored type {v['$type']!r}")
            known = {f.name for f in dataclasses.fields(cls)}
            return _Obj(cls, {k: self.dec(x) for k, x in v["fields"].items() if k in known})
        raise SnapshotError(f"unexpected stored value {sorted(v)[:3]}")


def _hashable(k):
    return tuple(_hashable(x) for x in k) if isinstance(k, list) else k


def _make(value, method):
    """Build the decoded values: dataclasses from their fields, a QuantizedKV with the rebuilt method and no
    device objects."""
    if isinstance(value, _Obj):
        fields = {k: _make(x, method) for k, x in value.fields.items()}
        if value.cls.__name__ == "QuantizedKV":
            fields["method"], fields["device"] = method, {}
        return value.cls(**fields)
    if isinstance(value, tuple):
        return tuple(_make(x, method) for x in value)
    if isinstance(value, list):
        return [_make(x, method) for x in value]
    if isinstance(value, dict):
        return {k: _make(x, method) for k, x in value.items()}
    return value


def save_results(res, path, extra: dict | None = None) -> str:
    """Write the host side of `res` (and `extra`, plain JSON values: compare rows, sweep points) to `path` (.npz),
    atomically (a temporary file renamed over it)."""
    w = _Writer()
    doc = {"format": FORMAT, "version": VERSION, "results": w.enc(res, "results"),
           "method": {"id": res.method.id, "options": clean(dict(res.method.options())), "layer": res.config.layer},
           "extra": clean(extra or {})}
    meta = np.frombuffer(json.dumps(doc, allow_nan=False).encode(), dtype=np.uint8)
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".results-", suffix=".npz", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez_compressed(fh, meta=meta, **w.arrays)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def load_results(path, stored_as: str = ""):
    """(Results, extra) from a file written by `save_results`; `stored_as` says where it came from (the overview
    says it). SnapshotError for a file that is not one, or one this kvviz cannot read."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise SnapshotError(f"no stored results at {path}")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError) as exc:
        raise SnapshotError(f"{path} is not a readable results file ({exc})") from None
    try:
        doc = json.loads(bytes(arrays.pop("meta")).decode())
    except (KeyError, ValueError, UnicodeDecodeError):
        raise SnapshotError(f"{path} is not a kvviz results file (no meta document)") from None
    if doc.get("format") != FORMAT:
        raise SnapshotError(f"{path} is not a kvviz results file")
    if int(doc.get("version", 0)) > VERSION:
        raise SnapshotError(f"{path} was written by a newer kvviz (results format {doc.get('version')}, this one "
                            f"reads {VERSION})", "Open it with the newer kvviz.")
    try:
        tree = _Reader(arrays, _types()).dec(doc["results"])
        m = doc["method"]
        method = get_method(m["id"], **(m.get("options") or {})).for_layer(int(m.get("layer", 0)))
        if not isinstance(tree, _Obj) or tree.cls.__name__ != "Results":
            raise SnapshotError(f"{path} holds no results")
        res = tree.cls(method=method, layouts=(), **{k: _make(x, method) for k, x in tree.fields.items()})
        res.layouts = batch_layouts(method, res.batch, res.key.shape[2])
    except SnapshotError:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged or foreign file: said, never a traceback
        raise SnapshotError(f"{path}: the stored results cannot be rebuilt ({type(exc).__name__}: {exc})") from None
    res.stored_as = stored_as or os.path.basename(path)
    return res, doc.get("extra") or {}
