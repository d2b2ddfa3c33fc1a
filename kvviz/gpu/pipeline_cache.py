"""The kernel cache: what makes a kernel built once cheap to build again, in this process and in the next.

Building a kernel is two steps: naga turns the shader into SPIR-V (fast), then the driver compiles that
into machine code, which is what takes long (lavapipe runs LLVM, for seconds on a large generated kernel).
What kvviz keeps, and where:

- In one process, `GpuRuntime` keeps every pipeline it built, keyed by the shader spec: a kernel is built
  once per runtime.
- Across processes, the driver's own cache of machine code. wgpu's pipeline cache would be the portable
  means, but the wgpu-native build that wgpu-py ships has no function to create or fill one (the adapter
  lists the `pipeline-cache` feature; `wgpu.h` declares no `wgpuDeviceCreatePipelineCache`), so the drivers'
  caches are what persists: Mesa's disk cache (lavapipe/llvmpipe keep the LLVM-compiled code of every
  shader there, keyed by the shader itself; lavapipe compiles a kernel when it is first dispatched) and the
  NVIDIA driver's own. `configure_driver_cache` points Mesa's cache at kvviz's cache folder, unless the user
  chose its place or turned it off (MESA_SHADER_CACHE_DIR / MESA_SHADER_CACHE_DISABLE, or their older
  MESA_GLSL_CACHE_* names), so kvviz's kernels are not evicted by other programs' shaders and go away with
  kvviz's folder.
- `KernelIndex`: the kernels built before on this adapter, driver and wgpu (a JSON file per adapter under
  the cache folder, listing digests of each kernel's source, entry point and layout). A kernel the index
  lists is in the driver's cache; one it does not list is a first build, which the runtime announces when it
  lasts longer than ANNOUNCE_AFTER_S (the window: "building kernels for head size D (first use)").

The cache folder is $KVVIZ_CACHE_DIR, else $XDG_CACHE_HOME/kvviz, else ~/.cache/kvviz. A cache that cannot be
read or written, or a damaged index, never stops a build: it is said once in the log and the kernel is built.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

log = logging.getLogger("kvviz.gpu.cache")

ENV_DIR = "KVVIZ_CACHE_DIR"
INDEX_FORMAT = 1
# A first build that lasts longer than this is announced to the listener (the window's status bar).
ANNOUNCE_AFTER_S = 1.0
# Mesa's variables that say where its shader cache is, or that it is off: set by the user, they are kept.
MESA_SETTINGS = ("MESA_SHADER_CACHE_DIR", "MESA_SHADER_CACHE_DISABLE", "MESA_GLSL_CACHE_DIR", "MESA_GLSL_CACHE_DISABLE")


def cache_root() -> Path:
    """Where kvviz keeps its caches: $KVVIZ_CACHE_DIR, else $XDG_CACHE_HOME/kvviz, else ~/.cache/kvviz."""
    own = os.environ.get(ENV_DIR)
    if own:
        return Path(own)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kvviz"


def writable_dir(path: Path) -> str:
    """Make `path` a folder this process can write: "" when it is, else why not."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-check.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        return ""
    except OSError as exc:
        return exc.strerror or str(exc)


@dataclass(frozen=True)
class DriverCache:
    """Where the driver keeps compiled kernels between runs, as far as kvviz can tell or set."""

    where: str  # a folder, or "" when the driver's own default place (or nowhere) applies
    how: str  # a line for the log and `kvviz info`
    off: bool = False  # Mesa's cache turned off by the user: on Mesa, every run builds every kernel anew

    def line(self) -> str:
        return self.how


_driver_cache: DriverCache | None = None
_driver_lock = threading.Lock()


def configure_driver_cache() -> DriverCache:
    """Point Mesa's shader cache at kvviz's cache folder, once per process, before the first adapter is
    opened (Mesa reads its variables when the driver starts). The user's own Mesa settings are kept; a
    folder that cannot be written leaves Mesa's default, said in the log."""
    global _driver_cache
    with _driver_lock:
        if _driver_cache is not None:
            return _driver_cache
        chosen = [k for k in MESA_SETTINGS if os.environ.get(k)]
        if chosen:
            d = os.environ.get("MESA_SHADER_CACHE_DIR") or os.environ.get("MESA_GLSL_CACHE_DIR") or ""
            off = any(os.environ.get(k, "").lower() in ("1", "true", "yes")
                      for k in MESA_SETTINGS if k.endswith("DISABLE"))
            how = ("Mesa's shader cache: off (" if off else "Mesa's shader cache: as set (") + ", ".join(
                f"{k}={os.environ[k]}" for k in chosen) + ")"
            _driver_cache = DriverCache("" if off else d, how, off)
        else:
            folder = cache_root() / "driver"
            why = writable_dir(folder)
            if why:
                log.warning("kernel cache: %s cannot be written (%s); the driver keeps its compiled kernels in its "
                            "default place", folder, why)
                _driver_cache = DriverCache("", f"Mesa's shader cache: its default place ({folder} cannot be "
                                                f"written: {why})")
            else:
                os.environ["MESA_SHADER_CACHE_DIR"] = str(folder)
                _driver_cache = DriverCache(str(folder), f"Mesa's shader cache: {folder}")
        log.info("kernel cache: %s", _driver_cache.how)
        return _driver_cache


def kernel_digest(frontend: str, entry: str, source: str, defines, bindings, immediate_size: int) -> str:
    """What identifies a built kernel: its front end, entry point, source as the front end sees it, the
    defines the front end applies itself (GLSL's, and the runtime-checks switch), and its layout."""
    h = hashlib.sha256()
    for part in (frontend, entry, repr(tuple(defines)), repr(tuple(bindings)), str(int(immediate_size)), source):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def adapter_identity(info: dict) -> dict:
    """What a driver's cached kernels depend on: the adapter, its driver, and the wgpu that built them."""
    import wgpu

    try:
        from wgpu.backends.wgpu_native import __version__ as native
    except ImportError:  # another backend
        native = ""
    return {"adapter": str(info.get("device", "")), "vendor": str(info.get("vendor", "")),
            "backend": str(info.get("backend_type", "")), "driver": str(info.get("description", "")),
            "wgpu": str(wgpu.__version__), "wgpu_native": str(native)}


class KernelIndex:
    """The kernels built before on one adapter + driver + wgpu: {digest: {"name", "seconds"}} in a JSON file.

    Thread-safe. Saved after each new kernel, merged with what other processes saved meanwhile (two runs
    at once lose nothing but, at worst, one entry, which is then announced once more)."""

    def __init__(self, path: Path | None, identity: dict):
        self.path = path
        self.identity = dict(identity)
        self._lock = threading.Lock()
        self._writable = path is not None
        self.kernels: dict[str, dict] = self._read(warn=True) if path is not None else {}
        # What start-up probes found on this adapter + driver + wgpu (the loop limit): a property of the driver,
        # so a later run reads it here instead of running the probe again
        self.probes: dict[str, object] = self._read_probes() if path is not None else {}

    @classmethod
    def for_adapter(cls, identity: dict) -> "KernelIndex":
        folder = cache_root() / "kernels"
        key = hashlib.sha256(json.dumps(identity, sort_keys=True, allow_nan=False).encode()).hexdigest()[:16]
        why = writable_dir(folder)
        if why:
            log.warning("kernel cache: %s cannot be written (%s); kernels are built as usual and every build "
                        "counts as a first one", folder, why)
            return cls(None, identity)
        return cls(folder / f"{key}.json", identity)

    def _read(self, warn: bool) -> dict:
        """The file's kernels; {} when there is no file, and when it is damaged or not this adapter's (said
        in the log when `warn`; the next save replaces it)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            if warn:
                log.warning("kernel cache: %s cannot be read (%s); it is started anew", self.path, exc)
            return {}
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT:
                raise ValueError(f"not a kvviz kernel index of format {INDEX_FORMAT}")
            if data.get("identity") != self.identity:
                raise ValueError("it is another adapter's, driver's or wgpu's")
            kernels = data.get("kernels")
            if not isinstance(kernels, dict) or not all(isinstance(k, str) and isinstance(v, dict)
                                                        for k, v in kernels.items()):
                raise ValueError("its kernel list is malformed")
            return kernels
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            if warn:
                log.warning("kernel cache: %s is damaged (%s); it is started anew", self.path, exc)
            return {}

    def _read_probes(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            return {}
        probes = data.get("probes") if isinstance(data, dict) and data.get("identity") == self.identity else None
        return dict(probes) if isinstance(probes, dict) else {}

    def probe(self, name: str, default=None):
        """A probe's stored answer ({"value": ...}), or `default` when no run on this adapter stored one."""
        got = self.probes.get(name)
        return got if isinstance(got, dict) and "value" in got else default

    def record_probe(self, name: str, value) -> None:
        with self._lock:
            self.probes[name] = {"value": value}
            self._save()

    def known(self, digest: str) -> bool:
        with self._lock:
            return digest in self.kernels

    def __len__(self) -> int:
        return len(self.kernels)

    def record(self, digest: str, name: str, seconds: float) -> None:
        """Add a kernel built (and first dispatched) in this process, and save."""
        with self._lock:
            self.kernels[digest] = {"name": name, "seconds": round(float(seconds), 3)}
            self._save()

    def _save(self) -> None:
        """Write the index, merged with what other processes saved meanwhile (under self._lock)."""
        if not self._writable:
            return
        merged = {**self._read(warn=False), **self.kernels}
        probes = {**self._read_probes(), **self.probes}
        data = {"format": INDEX_FORMAT, "identity": self.identity, "kernels": merged, "probes": probes}
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tmp.write_text(json.dumps(data, allow_nan=False, indent=1))
            os.replace(tmp, self.path)
        except OSError as exc:
            self._writable = False
            log.warning("kernel cache: %s cannot be written (%s); kernels are built as usual and the next "
                        "run builds them as first ones", self.path, exc)
            try:
                tmp.unlink()
            except OSError:
                pass


Listener = Callable[[int, str, float], None]  # (kernels built so far in this scope, kernel now building, its seconds)


class BuildWatch:
    """Announces first builds that last: while one runs past `after_s`, `listener(done, name, seconds)` is
    called from a timer thread, then about every second until it ends. `done` counts the first builds this
    watch saw end (their first dispatch: a pipeline's creation is only the start of its build)."""

    def __init__(self, listener: Listener, after_s: float | None = None):
        self.listener = listener
        self.after_s = ANNOUNCE_AFTER_S if after_s is None else float(after_s)
        self.done = 0
        self.announced = 0

    def building(self, name: str, counted: bool = True) -> "_Building":
        return _Building(self, name, counted)


class _Building:
    def __init__(self, watch: BuildWatch, name: str, counted: bool):
        self.watch, self.name, self.counted = watch, name, counted
        self._end = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self):
        self.t0 = time.perf_counter()
        if self.watch.after_s <= 0:  # every first build announced, from its start
            self._announce()
        self._thread = threading.Thread(target=self._tick, name="kvviz-build-watch", daemon=True)
        self._thread.start()
        return self

    def _announce(self) -> bool:
        w = self.watch
        try:
            w.listener(w.done, self.name, time.perf_counter() - self.t0)
        except Exception as exc:  # noqa: BLE001 - a listener's failure must not touch the build
            log.debug("build listener failed: %s", exc)
            return False
        w.announced += 1
        return True

    def _tick(self) -> None:
        wait = self.watch.after_s if self.watch.after_s > 0 else 1.0
        while not self._end.wait(wait):
            if not self._announce():
                return
            wait = 1.0

    def __exit__(self, exc_type, exc, tb):
        self._end.set()
        self._thread.join()
        if exc_type is None and self.counted:
            self.watch.done += 1
        return False
