"""Run the method comparison (kvviz.analysis.compare, when present) on a computed `Results` (Qt-free)."""
from __future__ import annotations

import importlib
import inspect

from kvviz.errors import KvvizError
from kvviz.families.registry import registry


class CompareUnavailable(KvvizError):
    hint = "kvviz.analysis.compare is not installed in this build; the other panels are unaffected."


def compare_available() -> bool:
    try:
        mod = importlib.import_module("kvviz.analysis.compare")
    except ImportError:
        return False
    return hasattr(mod, "compare_methods")


def results_scale(res) -> float:
    """The softmax scale `Session.compute` used for these results."""
    return float(res.scale)


def method_instances(res) -> list:
    """One instance of every registered method: the results' own method with its options, the others
    with their defaults."""
    out = []
    for key, cls in registry().items():
        if key == res.method.id:
            out.append(res.method)
            continue
        # its defaults, then the settings it asks to be compared at (COMPARE_SETTINGS, e.g. TurboQuant's bit widths)
        for opts in ({},) + tuple(getattr(cls, "COMPARE_SETTINGS", ())):
            try:
                out.append(cls(**opts).for_layer(res.config.layer))  # the workload's layer (TurboQuant's rotation)
            except Exception:  # noqa: BLE001 - a method that cannot be built with these options is skipped
                continue
    return out


def run_compare(session, res, methods=None, progress=None, cancel=None) -> list[dict]:
    """compare_methods(ctx, batch, key, value, q, scale, methods) on the results' exact K/V/Q.

    `methods`: KVMethod instances (default: every registered method). When compare_methods takes
    no progress/cancel arguments, it is called one method at a time, so the worker can report
    progress and stop between methods (the f32 baseline is recomputed each call). A method that
    cannot take the shape gets a row with its error and no numbers.
    """
    try:
        mod = importlib.import_module("kvviz.analysis.compare")
        fn = mod.compare_methods
    except (ImportError, AttributeError) as exc:
        raise CompareUnavailable(f"Method comparison is not available: {exc}") from exc
    if methods is None:
        methods = method_instances(res)
    ctx = session.ctx(res.config.frontend)
    scale = results_scale(res)
    progress = progress or (lambda f, m: None)
    cancel = cancel or (lambda: False)
    H, kvh, D = res.q.shape[1], res.key.shape[1], res.key.shape[2]
    params = inspect.signature(fn).parameters
    usable, rows = [], []
    for m in methods:
        try:
            m.check(H, kvh, D, res.batch.block_size)
            usable.append(m)
        except KvvizError as exc:
            rows.append(_error_row(m, exc))
    if "progress" in params and "cancel" in params:
        rows = [dict(r) for r in fn(ctx, res.batch, res.key, res.value, res.q, scale, usable,
                                      progress=progress, cancel=cancel)] + rows
        return [_normalise(r) for r in rows]
    done = []
    for i, m in enumerate(usable):
        if cancel():
            break
        progress(i / max(1, len(usable)), f"comparing {m.id}")
        try:
            done.extend(dict(r) for r in fn(ctx, res.batch, res.key, res.value, res.q, scale, [m]))
        except KvvizError as exc:
            done.append(_error_row(m, exc))
    progress(1.0, "comparison done")
    return [_normalise(r) for r in done + rows]


def _error_row(m, exc) -> dict:
    return {"method": m.id, "name": m.option_name(), "label": getattr(m, "label", m.id), "options": dict(m.options()),
            "bits_per_element": float("nan"),
            "kl_mean": float("nan"), "rel_l2": float("nan"), "error": str(exc)}


def _normalise(r: dict) -> dict:
    """compare.py names the output error `out_rel_l2`; the panel and report read `rel_l2`."""
    r = dict(r)
    if "rel_l2" not in r and "out_rel_l2" in r:
        r["rel_l2"] = r["out_rel_l2"]
    return r
