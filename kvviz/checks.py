"""Command-line inputs checked before any work: argparse types for counts, and output paths (a report
folder or a result file) the run can really write.

The CLI calls these first, so a bad `--out`/`--json` costs a one-line message and exit 2 instead of a
traceback after minutes of GPU work. Writability is probed by creating (and removing) a file rather
than with os.access: root passes every access() check, yet cannot create entries under a regular
file or in /proc.
"""
from __future__ import annotations

import argparse
import os
import tempfile

from kvviz.errors import InvalidInput


def _int_arg(text: str) -> int:
    try:
        return int(text, 10)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (argparse prints the one-line error and exits 2)."""
    n = _int_arg(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {n}")
    return n


def nonneg_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    n = _int_arg(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {n}")
    return n


def _nearest_existing(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.lexists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def _refuse_under_file(path: str, arg: str) -> None:
    anc = _nearest_existing(os.path.dirname(os.path.abspath(path)) or ".")
    if os.path.exists(anc) and not os.path.isdir(anc):
        raise InvalidInput(f"{arg}: cannot write {path!r}: {anc!r} is a file, not a folder",
                           f"Give {arg} a path in a folder.")


def check_out_dir(path, arg: str = "--out") -> str:
    """Create the output folder `path` (and its parents) now and prove a file can be written in it."""
    if path is None or not str(path).strip():
        raise InvalidInput(f"{arg}: the output folder is empty", f"Give {arg} a folder, e.g. {arg} report")
    path = str(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise InvalidInput(f"{arg}: {path!r} is a file, not a folder", f"Give {arg} a new or existing folder.")
    _refuse_under_file(path, arg)
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".kvviz-write-check-"):
            pass
    except OSError as exc:
        raise InvalidInput(f"{arg}: cannot write to folder {path!r}: {exc.strerror or exc}",
                           f"Give {arg} a folder you can write to.") from exc
    return path


def check_out_file(path, arg: str, suffixes: tuple = ()) -> str:
    """Prove that the file `path` can be written (its folder exists and takes a new file) without
    leaving anything behind; an existing file is opened for append, never truncated."""
    if path is None or not str(path).strip():
        raise InvalidInput(f"{arg}: the output path is empty", f"Give {arg} a file path.")
    path = str(path)
    if suffixes and os.path.splitext(path)[1].lower() not in suffixes:
        raise InvalidInput(f"{arg}: {path!r} must end in {' or '.join(suffixes)}", f"Give {arg} a {suffixes[0]} path.")
    if os.path.isdir(path):
        raise InvalidInput(f"{arg}: {path!r} is a folder, not a file", f"Give {arg} a file path.")
    _refuse_under_file(path, arg)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise InvalidInput(f"{arg}: the folder {parent!r} does not exist", f"Create it first or give {arg} another path.")
    existed = os.path.lexists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        raise InvalidInput(f"{arg}: cannot write {path!r}: {exc.strerror or exc}",
                           f"Give {arg} a path you can write to.") from exc
    if not existed:
        os.remove(path)
    return path
