"""The loop-limit check of a user's kernel, on an adapter that bounds loop iterations.

Mesa's lavapipe gives each shader invocation one loop limiter over all its loops (65535 iterations; measured at
start-up, `GpuRuntime.loop_limit`, see kvviz/gpu/loop_budget.py); when it runs out, every loop ends at its next
back-edge and the kernel carries on with whatever it has. A kernel that loops forever (a WGSL `loop {}` without a
break, a loop on data that never meets its condition, a GLSL `while`) then ends anyway, and its output may even
pass the oracle check: on a GPU without the bound it would not end.

So on such an adapter the lab checks a second build of the user's kernel (the first, as written, is the one
timed). Every loop of it adds a word of the check buffer to a total the wrapper tests, so no compiler can delete
a loop as having no effect (on lavapipe a `loop {}` that does nothing never reaches the limit unless so kept:
the compilers on the way drop it, where a driver that keeps it would run it forever). Its entry point is wrapped:
the wrapper calls the user's entry function, then runs a probe loop of PROBE_ITERATIONS iterations and counts,
in the check buffer, the invocations whose probe loop ended early: those whose limiter the user's code had used
up. The check buffer is one binding more than the slot's contract (after its last). A count above zero flags
the kernel on its check row.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from kvviz.gpu.shaders import _strip_comments

PROBE_ITERATIONS = 2
# the check buffer's words: [0] invocations that ran out of loop iterations, [1] the probe's iterations,
# [2], [3] ones the probe loop adds up
CHECK_WORDS = np.array([0, PROBE_ITERATIONS, 1, 1], np.uint32)
USER_ENTRY = "kvviz_user_entry"


class NotWrappable(ValueError):
    """The source's entry point could not be found or wrapped (the kernel then runs unchecked)."""


def _matching(src: str, open_at: int, pair: str = "()") -> int:
    """Index of the bracket closing the one at `open_at`."""
    depth = 0
    for i in range(open_at, len(src)):
        if src[i] == pair[0]:
            depth += 1
        elif src[i] == pair[1]:
            depth -= 1
            if depth == 0:
                return i
    raise NotWrappable(f"no closing {pair[1]!r}")


def _split_params(params: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for c in params:
        depth += (c in "(<") - (c in ")>")
        if c == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += c
    if cur.strip():
        out.append(cur)
    return [p.strip() for p in out if p.strip()]


_ATTR = re.compile(r"@\s*\w+\s*(\([^()]*(\([^()]*\)[^()]*)*\))?")


def keep_loops(src: str, keep: str, lang: str) -> str:
    """`src` (comments stripped) with the statement `keep` first in the braced body of every loop (WGSL: loop,
    for, while; GLSL: for, while, do); a loop whose body is not braced is left as it is."""
    keywords = ("loop", "for", "while") if lang == "wgsl" else ("for", "while", "do")
    out, at = [], 0
    for m in re.finditer(r"\b(" + "|".join(keywords) + r")\b", src):
        if m.start() < at:
            continue
        word, i = m.group(1), m.end()
        if word == "for" or (word == "while" and lang == "glsl"):  # a parenthesised header
            j = src.find("(", i)
            if j < 0 or src[i:j].strip():
                continue
            i = _matching(src, j) + 1
        elif word == "while":  # WGSL `while cond {`: a condition has no braces
            j = src.find("{", i)
            i = j if j >= 0 else len(src)
        i += len(src[i:]) - len(src[i:].lstrip())
        if not src.startswith("{", i):
            continue  # GLSL's `do { } while (c);` or an unbraced body
        out.append(src[at:i + 1] + f" {keep} ")
        at = i + 1
    return "".join(out) + src[at:]


def wrap_wgsl(src: str, entry: str, binding: int) -> str:
    """The WGSL `src` with its loops kept (keep_loops) and its entry point `entry` renamed to a plain function
    the wrapper calls first."""
    keep = "kvviz_loop_keep = kvviz_loop_keep + atomicLoad(&kvviz_loop_check[2]);"
    src = keep_loops(_strip_comments(src), keep, "wgsl")
    heads = list(re.finditer(r"\bfn\s+" + re.escape(entry) + r"\s*\(", src))
    if len(heads) != 1:
        raise NotWrappable(f"{len(heads)} declarations of fn {entry}")
    fn_at, open_at = heads[0].start(), heads[0].end() - 1
    close_at = _matching(src, open_at)
    attrs_at = max(src.rfind(";", 0, fn_at), src.rfind("}", 0, fn_at)) + 1
    attrs = src[attrs_at:fn_at].strip()
    if "@compute" not in attrs.replace(" ", ""):
        raise NotWrappable(f"fn {entry} is not marked @compute")
    params = _split_params(src[open_at + 1:close_at])
    plain = [_ATTR.sub("", p).strip() for p in params]
    names = [p.split(":", 1)[0].strip() for p in plain]
    if not all(re.fullmatch(r"\w+", n) for n in names):
        raise NotWrappable(f"parameters of fn {entry} not understood")
    body = src[:attrs_at] + f"\nfn {USER_ENTRY}({', '.join(plain)})" + src[close_at + 1:]
    return body + f"""
@group(0) @binding({binding}) var<storage, read_write> kvviz_loop_check: array<atomic<u32>, 4>;
var<private> kvviz_loop_keep: u32;
{attrs}
fn {entry}({', '.join(params)}) {{
  {USER_ENTRY}({', '.join(names)});
  let kvviz_n = atomicLoad(&kvviz_loop_check[1]);
  var kvviz_ran = 0u;
  for (var kvviz_i = 0u; kvviz_i < kvviz_n; kvviz_i = kvviz_i + 1u) {{
    kvviz_ran = kvviz_ran + atomicLoad(&kvviz_loop_check[2u + (kvviz_i & 1u)]);
  }}
  if (kvviz_ran < kvviz_n) {{ atomicAdd(&kvviz_loop_check[0], 1u); }}
  if (kvviz_loop_keep == 0xFFFFFFFFu) {{ atomicStore(&kvviz_loop_check[3], 1u); }}
}}
"""


def wrap_glsl(src: str, binding: int) -> str:
    """The GLSL `src` with its loops kept (keep_loops) and its `main` renamed to a plain function the wrapper
    calls first."""
    decl = f"layout(std430, set = 0, binding = {binding}) buffer KvvizLoopCheck {{ uint kvviz_loop_check[]; }};\n"
    src = keep_loops(_strip_comments(src), "kvviz_loop_keep += kvviz_loop_check[2];", "glsl")
    src, n = re.subn(r"\bvoid\s+main\s*\(\s*(void)?\s*\)", f"void {USER_ENTRY}()", src)
    if n != 1:
        raise NotWrappable(f"{n} declarations of void main()")
    # the buffer and the value the loops add to go before the user's code, which uses them: after the #version
    # line and the directives that must come before any declaration (#extension)
    head = re.match(r"(\s*#(version|extension)[^\n]*\n)+", src)
    if head is None or "#version" not in head.group(0):
        raise NotWrappable("no #version line")
    src = src[:head.end()] + decl + "uint kvviz_loop_keep = 0u;\n" + src[head.end():]
    return src + f"""
void main() {{
  {USER_ENTRY}();
  uint kvviz_n = kvviz_loop_check[1];
  uint kvviz_ran = 0u;
  for (uint kvviz_i = 0u; kvviz_i < kvviz_n; kvviz_i++) {{ kvviz_ran += kvviz_loop_check[2u + (kvviz_i & 1u)]; }}
  if (kvviz_ran < kvviz_n) {{ atomicAdd(kvviz_loop_check[0], 1u); }}
  if (kvviz_loop_keep == 0xFFFFFFFFu) {{ kvviz_loop_check[3] = 1u; }}
}}
"""


@dataclass
class LoopCheck:
    """The loop-checked build of one user kernel and its check buffer: reset before the checked run, read after."""

    rt: object
    kernel: object  # kvviz.gpu.runtime.Kernel: the wrapped build (wrap_wgsl / wrap_glsl)
    buffer: object
    binding: int
    limit: int

    @classmethod
    def create(cls, rt, kernel, binding: int) -> "LoopCheck":
        return cls(rt, kernel, rt.upload(CHECK_WORDS, "kvviz-loop-check"), binding, int(rt.loop_limit))

    def reset(self) -> None:
        self.rt.write(self.buffer, CHECK_WORDS)

    def invocations(self) -> int:
        """Invocations that ran out of loop iterations since the last reset."""
        return int(self.rt.read(self.buffer, np.uint32, nbytes=16)[0])
