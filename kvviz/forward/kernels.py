"""Kernels of the forward pass on the GPU (shaders/forward/): KernelSpecs, weight matrices on the device and the
host launchers that turn a step of the forward into Dispatches. Oracles: kvviz/forward/oracle.py.

Layouts (row-major, f32 unless said):
  activations  [T, width]: one row a token
  weights      DeviceMatrix: [N, K] (a Linear layer's [out, in]), f32 or f16, in parts of rows when the whole
               matrix passes the adapter's storage-binding limit
  qkv          [T, nq*D + 2*nkv*D]: a token's query heads, key heads, value heads
  KV cache     [cap, nkv, D] per layer, position-major (the forward's own cache; growing it is a prefix copy)
Every launcher checks its shapes first (InvalidInput / UnsupportedShape / DeviceLimitError, before any dispatch).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from kvviz.errors import DeviceLimitError, InvalidInput, UnsupportedShape
from kvviz.gpu import loop_budget, trusted
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.runtime import Dispatch, GpuRuntime
from kvviz.gpu.templates import render_defines

MM_IMM = Struct("P", "m n k ldo n_off flags gx")
MATMUL = KernelSpec("forward/matmul.wgsl", bindings=ro("x", "w", "bias") + rw("out"), immediates=MM_IMM)
MATVEC = KernelSpec("forward/matvec.wgsl", bindings=ro("x", "w", "bias") + rw("out"), immediates=MM_IMM)
NORM = KernelSpec("forward/norm.wgsl", bindings=ro("src", "w") + rw("dst"),
                  immediates=Struct("P", "rows per n in_off in_ld out_off out_ld flags gx eps:f32"))
ROPE = KernelSpec("forward/rope.wgsl", bindings=rw("qkv") + ro("tables") + rw("kc", "vc"),
                  immediates=Struct("P", "t nq nkv d rot ld start cap mode store gx"))
ATTENTION = KernelSpec("forward/attention.wgsl", bindings=ro("qkv", "kc", "vc") + rw("out"),
                       immediates=Struct("P", "t start nq nkv ld window hb scale:f32 softcap:f32"))
GLU = KernelSpec("forward/glu.wgsl", bindings=ro("gu") + rw("out"), immediates=Struct("P", "t f act gx"))
SOFTCAP = KernelSpec("forward/softcap.wgsl", bindings=rw("buf"), immediates=Struct("P", "n gx cap:f32"))
EMBED = KernelSpec("forward/embed.wgsl", bindings=ro("ids", "table") + rw("out"),
                   immediates=Struct("P", "t h row0 rows gx scale:f32"))

MATVEC_ROWS = 8  # a decode step's rows: up to this many go through the mat-vec kernel (one variant each)
FLAG_BIAS, FLAG_RESIDUAL = 1, 2
NORM_ADD, NORM_INPLACE = 1, 2
ACTS = {"silu": 0, "gelu_tanh": 1}
ROPE_MODES = {"neox": 0, "normal": 1}
WEIGHT_DTYPES = ("f32", "f16")
F16_MAX = 65504.0


@dataclass(frozen=True)
class GemmConfig:
    """A tile shape of forward/matmul.wgsl: BM x BN outputs a workgroup, BK along K a step, TM x TN a thread."""

    bm: int = 128
    bn: int = 128
    bk: int = 16
    tm: int = 8
    tn: int = 8

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    @property
    def shared_bytes(self) -> int:
        return 16 * self.bk * (self.bm // 4 + 1 + self.bn // 4 + 1)

    def label(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}, {self.tm}x{self.tn} a thread"

    def check(self, rt: GpuRuntime | None = None) -> None:
        """UnsupportedShape unless the tile divides as the shader assumes and fits the adapter's workgroup."""
        bad = []
        if self.tm % 4 or self.tn % 4 or self.bm % self.tm or self.bn % self.tn or self.bk % 4:
            bad.append("TM and TN multiples of 4 dividing BM and BN, BK a multiple of 4")
        nt = self.threads
        if nt < 1 or nt > 256 or (self.bm * self.bk // 4) % nt or (self.bn * self.bk // 4) % nt:
            bad.append(f"{nt} threads that split the {self.bm}x{self.bk} and {self.bn}x{self.bk} tiles evenly")
        if self.bk > 16 or self.tm > 16 or self.tn > 16:
            bad.append("BK, TM and TN of at most 16 (their loops are unrolled)")
        if rt is not None:
            limit = int(rt.limits.get("max-compute-workgroup-storage-size", 16384) or 16384)
            if self.shared_bytes > limit:
                bad.append(f"{self.shared_bytes} bytes of workgroup memory within the adapter's {limit}")
        if bad:
            raise UnsupportedShape(f"GEMM tile {self.label()} needs " + "; ".join(bad))

    def defines(self) -> dict:
        nt = self.threads
        return dict(BM=self.bm, BN=self.bn, BK=self.bk, TM=self.tm, TN=self.tn, TX=self.bn // self.tn,
                    TY=self.bm // self.tm, NT=nt, RG=self.tm // 4, CG=self.tn // 4, AC=self.tm * self.tn // 4,
                    SA=self.bm // 4 + 1, SB=self.bn // 4 + 1, LA=self.bm * self.bk // 4 // nt,
                    LB=self.bn * self.bk // 4 // nt, K4=self.bk // 4, TA=self.bk * (self.bm // 4 + 1),
                    TB=self.bk * (self.bn // 4 + 1))


LARGE = GemmConfig(128, 128, 16, 8, 8)
MEDIUM = GemmConfig(64, 64, 16, 4, 4)
# Other tiles `kvviz bench --gemm` times beside these (what another GPU may prefer): half the K step, half the N tile.
ALTERNATIVES = (GemmConfig(128, 128, 8, 8, 8), GemmConfig(128, 64, 16, 8, 4))
# LARGE's tiles where they make at least this many workgroups (two a multiprocessor of a 128-SM GPU), MEDIUM's
# (four times as many, a quarter the size) on smaller products so that more multiprocessors have work. The
# threshold is reasoned, not measured: `kvviz bench --gemm` times both tiles on any shape.
LARGE_MIN_GROUPS = 256


def _load_defines(vec: int, wdtype: str) -> dict:
    d = render_defines("forward/loads.wgsl.j2", vec=vec, wdtype=wdtype)
    xtype = "vec4<f32>" if vec == 4 else "f32"
    wtype = {("f32", 4): "vec4<f32>", ("f32", 1): "f32", ("f16", 4): "vec2<u32>", ("f16", 1): "u32"}[(wdtype, vec)]
    return dict(d, XTYPE=xtype, WTYPE=wtype)


def _cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


# ------------------------------------------------------------------------------------------ device matrices
@dataclass
class DeviceMatrix:
    """A weight matrix [rows, cols] on the device, f32 or f16, as parts of consecutive rows (one buffer each)."""

    name: str
    rows: int
    cols: int
    dtype: str
    parts: list = field(default_factory=list)  # (first row, rows, buffer)

    @property
    def nbytes(self) -> int:
        return self.rows * self.cols * (2 if self.dtype == "f16" else 4)

    def destroy(self) -> None:
        for _, _, buf in self.parts:
            buf.destroy()
        self.parts = []


def f16_exact(blocks: Sequence[np.ndarray]) -> bool:
    """Every value of the blocks is an f16 value (so an f16 copy holds the matrix exactly)."""
    for b in blocks:
        a = np.asarray(b, np.float32)
        for i in range(0, a.shape[0], 4096):  # bounded temporaries
            s = a[i:i + 4096]
            with np.errstate(over="ignore"):
                if not np.array_equal(s.astype(np.float16).astype(np.float32), s):
                    return False
    return True


def upload_matrix(rt: GpuRuntime, blocks: Sequence[np.ndarray], name: str, dtype: str,
                  max_bytes: int | None = None) -> DeviceMatrix:
    """The row blocks (f32 [n_i, K], stacked in order) as one DeviceMatrix of `dtype`, in parts of at most
    `max_bytes` (default: the adapter's storage-binding limit). f16: values beyond f16's range are refused naming
    the matrix; others round to the nearest f16."""
    blocks = [np.asarray(b) for b in blocks]
    if dtype not in WEIGHT_DTYPES:
        raise InvalidInput(f"weight type {dtype!r}; choose one of {', '.join(WEIGHT_DTYPES)}")
    if not blocks or any(b.ndim != 2 or b.shape[1] != blocks[0].shape[1] for b in blocks):
        raise InvalidInput(f"{name}: row blocks of one width expected, got {[b.shape for b in blocks]}")
    cols = int(blocks[0].shape[1])
    rows = int(sum(b.shape[0] for b in blocks))
    if rows == 0 or cols == 0:
        raise InvalidInput(f"{name}: an empty matrix ({rows} x {cols})")
    if dtype == "f16":
        big = max(float(np.abs(b).max(initial=0.0)) for b in blocks)
        if not big <= F16_MAX:
            raise InvalidInput(f"{name} holds values up to {big:.6g}, beyond f16's range (65504)",
                               "Keep this model's weights in f32 on the GPU (weights='f32' or 'exact').")
    item = 2 if dtype == "f16" else 4
    limit = int(max_bytes or rt.max_binding)
    per = limit // (cols * item)
    if per < 1:
        raise DeviceLimitError(f"{name}: one row of {cols} {dtype} values passes the adapter's storage-binding "
                               f"limit of {limit / 2**20:.1f} MiB ({rt.summary.name})")
    if per >= 128:
        per -= per % 128  # parts on whole GEMM tiles
    mat = DeviceMatrix(name, rows, cols, dtype)
    starts = np.cumsum([0] + [b.shape[0] for b in blocks])
    for r0 in range(0, rows, per):
        r1 = min(rows, r0 + per)
        pieces = [blocks[i][max(r0, starts[i]) - starts[i]: min(r1, starts[i + 1]) - starts[i]]
                  for i in range(len(blocks)) if starts[i] < r1 and starts[i + 1] > r0]
        host = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
        host = np.ascontiguousarray(host, np.float16 if dtype == "f16" else np.float32)
        buf = rt.empty(host.nbytes, f"{name}[{r0}:{r1}]")
        rt.write(buf, host)
        mat.parts.append((r0, r1 - r0, buf))
    return mat


# ------------------------------------------------------------------------------------------ launchers
def _grid(rt: GpuRuntime, groups: int) -> tuple[int, int]:
    """(gx, gy) covering `groups` workgroups within the adapter's per-dimension limit."""
    gx = max(1, min(int(groups), rt.max_grid))
    gy = _cdiv(groups, gx)
    if gy > rt.max_grid:
        raise DeviceLimitError(f"{groups} workgroups pass the adapter's grid of {rt.max_grid} x {rt.max_grid}")
    return gx, gy


def _buf_size(b) -> int:
    return int(b[2]) if isinstance(b, tuple) else int(b.size)


def attention_tile(head_size: int, group: int, tokens: int) -> tuple[int, int, int]:
    """(TQ tokens, GR heads, BC positions) of a forward/attention.wgsl workgroup: up to 64 rows (token, head), the
    K and V tiles within 16 KiB of workgroup memory."""
    gr = min(group, 64)
    tq = max(1, min(64 // gr, int(tokens)))
    if tq > 1:
        tq = 1 << (tq.bit_length() - 1)
    bc = max(1, min(16, 2048 // head_size))
    return tq, gr, bc


def attention_loop_cost(head_size: int, group: int, tokens: int, positions: int) -> int:
    """loop_budget's bound of forward/attention.wgsl: one loop over the tiles of the workgroup's positions, each
    loading its K and V rows in a strided loop (everything else unrolled)."""
    tq, gr, bc = attention_tile(head_size, group, tokens)
    wg = tq * gr * 4
    tiles = _cdiv(positions, bc)
    return loop_budget._loop(tiles) + tiles * loop_budget._loop(_cdiv(bc * head_size // 4, wg))


class ForwardKernels:
    """Compiles and dispatches the forward's kernels on one runtime."""

    def __init__(self, rt: GpuRuntime):
        self.rt = rt
        self._dummy = rt.empty(16, "forward-unused-binding")

    # -- matrix multiply ---------------------------------------------------------------------------------------
    def gemm_config(self, m: int, n: int) -> GemmConfig:
        """LARGE tiles when they give a large GPU enough workgroups, else MEDIUM."""
        return LARGE if _cdiv(m, LARGE.bm) * _cdiv(n, LARGE.bn) >= LARGE_MIN_GROUPS else MEDIUM

    def matmul(self, x, m: int, mat: DeviceMatrix, out, *, ldo: int | None = None, col0: int = 0, bias=None,
               residual: bool = False, config: GemmConfig | None = None, matvec: bool | None = None,
               checks: bool = True) -> list[Dispatch]:
        """out[r, col0 + n] (+)= x[r] . mat[n] (+ bias[n]) for the m rows of x [m, mat.cols]: one dispatch a part of
        the matrix. residual=True adds to what out holds. m <= MATVEC_ROWS takes the mat-vec kernel unless
        matvec=False (config: the GEMM's tile, default gemm_config). checks=False: the shader module without
        naga's runtime checks (kvviz/gpu/trusted.py; a measured variant of the bench, the shapes checked here)."""
        k, n_all = mat.cols, mat.rows
        ldo = n_all if ldo is None else int(ldo)
        if m < 1:
            raise InvalidInput(f"{mat.name}: a product of {m} rows; give at least one")
        if col0 + n_all > ldo:
            raise InvalidInput(f"{mat.name}: columns {col0}..{col0 + n_all} do not fit output rows of {ldo}")
        if _buf_size(x) < m * k * 4 or _buf_size(out) < m * ldo * 4:
            raise InvalidInput(f"{mat.name}: buffers of {_buf_size(x)} and {_buf_size(out)} bytes cannot hold "
                               f"[{m}, {k}] and [{m}, {ldo}] f32")
        vec = 4 if k % 4 == 0 else 1
        defines = _load_defines(vec, mat.dtype)
        use_mv = (m <= MATVEC_ROWS) if matvec is None else bool(matvec)
        if use_mv and m > MATVEC_ROWS:
            raise InvalidInput(f"the mat-vec kernel takes at most {MATVEC_ROWS} rows, got {m}")
        if not checks:
            if not trusted.available():
                raise UnsupportedShape("this wgpu has no shader modules without runtime checks")
            defines[trusted.RUNTIME_CHECKS_OFF[0]] = trusted.RUNTIME_CHECKS_OFF[1]
        flags = (FLAG_BIAS if bias is not None else 0) | (FLAG_RESIDUAL if residual else 0)
        bias_b = bias if bias is not None else self._dummy
        if use_mv:
            loop_budget.check(self.rt, "forward matvec", lambda kk: loop_budget._loop(_cdiv(kk, 128)) + 40, k, "K")
            kern = self.rt.compile(MATVEC, MR=m, RED=256 * m, **defines)
        else:
            cfg = config or self.gemm_config(m, n_all)
            cfg.check(self.rt)
            loop_budget.check(self.rt, "forward matmul", lambda kk: loop_budget._loop(_cdiv(kk, cfg.bk)) + 4, k, "K")
            kern = self.rt.compile(MATMUL, **cfg.defines(), **defines)
        ds = []
        for r0, rows, buf in mat.parts:
            if use_mv:
                gx, gy = _grid(self.rt, _cdiv(rows, MATVEC_ROWS))
                grid = (gx, gy, 1)
            else:
                grid = (_cdiv(rows, cfg.bn), _cdiv(m, cfg.bm), 1)
                gx = grid[0]
            ds.append(kern.dispatch(grid, [x, buf, bias_b, out], m=m, n=rows, k=k, ldo=ldo, n_off=col0 + r0,
                                    flags=flags, gx=gx))
        return ds

    # -- elementwise and row kernels -----------------------------------------------------------------------------
    def rms_norm(self, src, w, dst, rows: int, n: int, eps: float, *, per: int = 1, in_off: int = 0,
                 in_ld: int | None = None, out_off: int = 0, out_ld: int | None = None, add: bool = False,
                 inplace: bool = False) -> list[Dispatch]:
        """dst row (+)= rms_norm(src row) * w for `rows` rows of n (per > 1: the per heads of a token, one weight);
        inplace=True normalises dst itself (src unused)."""
        if rows < 1 or n < 1:
            raise InvalidInput(f"rms norm of {rows} rows of {n}; give at least one of each")
        in_ld = per * n if in_ld is None else in_ld
        out_ld = per * n if out_ld is None else out_ld
        loop_budget.check(self.rt, "forward rms norm", lambda nn: 2 * loop_budget._loop(_cdiv(nn, 128)) + 20, n, "row")
        kern = self.rt.compile(NORM)
        gx, gy = _grid(self.rt, rows)
        flags = (NORM_ADD if add else 0) | (NORM_INPLACE if inplace else 0)
        return [kern.dispatch((gx, gy, 1), [self._dummy if inplace else src, w, dst], rows=rows, per=per, n=n,
                              in_off=in_off, in_ld=in_ld, out_off=out_off, out_ld=out_ld, flags=flags, gx=gx,
                              eps=float(eps))]

    def rope(self, qkv, tables, kc, vc, t: int, nq: int, nkv: int, d: int, *, rot: int | None = None,
             ld: int | None = None, start: int = 0, cap: int = 0, mode: str = "neox", store: bool = True
             ) -> list[Dispatch]:
        rot = d if rot is None else int(rot)
        if d % 2 or rot % 2 or not 0 < rot <= d:
            raise UnsupportedShape(f"RoPE of {rot} dims of heads of {d}: both even, rotated dims within the head")
        if mode not in ROPE_MODES:
            raise InvalidInput(f"RoPE mode {mode!r}; choose one of {', '.join(ROPE_MODES)}")
        if store and start + t > cap:
            raise InvalidInput(f"positions {start}..{start + t} do not fit a cache of {cap}")
        ld = (nq + 2 * nkv) * d if ld is None else ld
        gx, gy = _grid(self.rt, _cdiv(t * (nq + 2 * nkv) * d // 2, 256))
        kern = self.rt.compile(ROPE)
        return [kern.dispatch((gx, gy, 1), [qkv, tables, kc if store else self._dummy, vc if store else self._dummy],
                              t=t, nq=nq, nkv=nkv, d=d, rot=rot, ld=ld, start=start, cap=cap,
                              mode=ROPE_MODES[mode], store=int(store), gx=gx)]

    def attention(self, qkv, kc, vc, out, t: int, nq: int, nkv: int, d: int, *, start: int = 0,
                  ld: int | None = None, scale: float | None = None, softcap: float = 0.0, window: int = 0
                  ) -> list[Dispatch]:
        """Causal attention of t tokens at positions start.. over the cache's positions 0..start+t-1."""
        if t < 1:
            raise InvalidInput("attention of no tokens")
        if d % 16:
            raise UnsupportedShape(f"the forward's attention takes head sizes that are multiples of 16, got {d}")
        if nkv < 1 or nq % nkv:
            raise UnsupportedShape(f"{nq} query heads are not a multiple of {nkv} KV heads")
        if window < 0 or softcap < 0:
            raise InvalidInput(f"a sliding window ({window}) and a soft cap ({softcap}) cannot be negative")
        if "subgroup" not in self.rt.features:
            raise UnsupportedShape(f"the forward's attention needs subgroup operations, which {self.rt.summary.name} "
                                   "lacks")
        group = nq // nkv
        tq, gr, bc = attention_tile(d, group, t)
        positions = start + t if window <= 0 else min(start + t, window + tq)
        loop_budget.check(self.rt, "forward attention", lambda n: attention_loop_cost(d, group, t, n), positions)
        ld = (nq + 2 * nkv) * d if ld is None else ld
        hb = _cdiv(group, gr)
        grid = (_cdiv(t, tq), nkv * hb, 1)
        if grid[0] > self.rt.max_grid or grid[1] > self.rt.max_grid:
            raise DeviceLimitError(f"attention grid {grid} passes the adapter's {self.rt.max_grid} a dimension")
        kern = self.rt.compile(ATTENTION, D=d, D4=d // 4, DL4=d // 16, TQ=tq, GR=gr, BC=bc, WG=tq * gr * 4,
                               TILE=bc * d // 4)
        return [kern.dispatch(grid, [qkv, kc, vc, out], t=t, start=start, nq=nq, nkv=nkv, ld=ld, window=int(window),
                              hb=hb, scale=float(1.0 / math.sqrt(d)) if scale is None else float(scale),
                              softcap=float(softcap))]

    def glu(self, gu, out, t: int, f: int, act: str = "silu") -> list[Dispatch]:
        if act not in ACTS:
            raise InvalidInput(f"activation {act!r}; choose one of {', '.join(ACTS)}")
        gx, gy = _grid(self.rt, _cdiv(t * f, 256))
        return [self.rt.compile(GLU).dispatch((gx, gy, 1), [gu, out], t=t, f=f, act=ACTS[act], gx=gx)]

    def softcap(self, buf, n: int, cap: float) -> list[Dispatch]:
        if not cap > 0:
            raise InvalidInput(f"a soft cap must be positive, got {cap}")
        gx, gy = _grid(self.rt, _cdiv(n, 256))
        return [self.rt.compile(SOFTCAP).dispatch((gx, gy, 1), [buf], n=n, gx=gx, cap=float(cap))]

    def embed(self, ids, mat: DeviceMatrix, out, t: int, *, scale: float = 1.0) -> list[Dispatch]:
        """out[t] = mat[ids[t]] * scale: one dispatch a part of the table (ids are checked by the caller)."""
        h = mat.cols
        tab = "table[i]" if mat.dtype == "f32" else "unpack2x16float(table[i >> 1u])[i & 1u]"
        kern = self.rt.compile(EMBED, TTYPE="f32" if mat.dtype == "f32" else "u32", TAB=tab)
        gx, gy = _grid(self.rt, _cdiv(t * h, 256))
        return [kern.dispatch((gx, gy, 1), [ids, buf, out], t=t, h=h, row0=r0, rows=rows, gx=gx, scale=float(scale))
                for r0, rows, buf in mat.parts]


# Every kernel of the family with representative defines (kvviz/families/catalogue.py checks each against its shader).
KERNELS = (
    MATMUL.define(**LARGE.defines(), **_load_defines(4, "f16")),
    MATVEC.define(MR=1, RED=256, **_load_defines(4, "f32")),
    NORM, ROPE,
    ATTENTION.define(D=128, D4=32, DL4=8, TQ=16, GR=4, BC=16, WG=256, TILE=512),
    GLU, SOFTCAP,
    EMBED.define(TTYPE="f32", TAB="table[i]"),
)
