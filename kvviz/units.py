"""Numbers with their units, for axes, hover readouts and figures (Qt-free).

Values are given in a base unit (seconds, bytes, bytes/s, FLOP/s) or in a scaled one (microseconds are
`us * 1e-6` seconds). `si` writes one value with an SI prefix ("1.5 ms", "56.7 GB/s"); `linear_ticks` and
`log_ticks` choose an axis's ticks (1-2-5 steps; decades, with 2 and 5 between them where there is room);
`tick_texts` writes a linear axis's ticks with one prefix for all of them, which the axis's title then
carries ("time (ms)"). Unitless numbers get no prefix between 0.001 and 10000; outside it a common power of
ten ("x1e-4") goes into the title of a linear axis, and a log axis writes powers of ten.
"""
from __future__ import annotations

import math

PREFIXES = ((1e-15, "f"), (1e-12, "p"), (1e-9, "n"), (1e-6, "\u00b5"), (1e-3, "m"), (1.0, ""), (1e3, "k"),
            (1e6, "M"), (1e9, "G"), (1e12, "T"), (1e15, "P"))
SUPERSCRIPT = str.maketrans("0123456789-", "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079\u207b")


def si_prefix(x: float) -> tuple[float, str]:
    """(factor, prefix) whose mantissa x / factor lies in [1, 1000) (0 and non-finite values: no prefix)."""
    a = abs(float(x))
    if not math.isfinite(a) or a == 0.0:
        return 1.0, ""
    best = PREFIXES[0]
    for f, p in PREFIXES:
        if a >= f * (1 - 1e-9):
            best = (f, p)
    return best


def _trim(text: str) -> str:
    if "." in text and "e" not in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def mantissa(x: float, digits: int = 3) -> str:
    """x with `digits` significant digits, no exponent, trailing zeros dropped (12.5, 100, 0.25)."""
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return _trim(f"{x:.{decimals}f}")


def si(x, unit: str = "", digits: int = 3) -> str:
    """One value in its base unit with an SI prefix: si(0.0015, "s") -> "1.5 ms", si(5.6e10, "B/s") -> "56 GB/s".
    Unitless values (unit "") keep plain numbers from 0.001 to 10000 and a power of ten outside it."""
    if x is None:
        return "-"
    x = float(x)
    if not math.isfinite(x):
        return "-" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if not unit:
        if x == 0 or 1e-3 <= abs(x) < 1e4:
            return mantissa(x, digits)
        e = math.floor(math.log10(abs(x)))
        m = x / 10.0 ** e
        return f"{mantissa(m, digits)}e{e}"
    f, p = si_prefix(x)
    m = mantissa(x / f, digits)
    if abs(float(m)) >= 1000 and f < PREFIXES[-1][0]:  # 999.9 B rounds to 1000 B: 1 kB
        f, p = si_prefix(float(m) * f)
        m = mantissa(x / f, digits)
    return f"{m} {p}{unit}"


def time_us(us, digits: int = 3) -> str:
    """A duration given in microseconds, in ns, us, ms or s."""
    return si(None if us is None else float(us) * 1e-6, "s", digits)


def nbytes(n, digits: int = 3) -> str:
    """A byte count in B, kB, MB, GB (powers of 1000, as GB/s)."""
    return si(n, "B", digits)


# ----------------------------------------------------------------------------------------- ticks
def nice_step(span: float, count: int) -> float:
    """The 1-2-2.5-5 x 10^k step that cuts `span` into at most `count` intervals."""
    if not span > 0 or count < 1:
        return 1.0
    raw = span / count
    e = 10.0 ** math.floor(math.log10(raw))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if m * e >= raw * (1 - 1e-9):
            return m * e
    return 10.0 * e


def linear_ticks(lo: float, hi: float, count: int) -> tuple[float, list, float, list]:
    """(step, major ticks, minor step, minor ticks) of [lo, hi] with at most `count` major intervals."""
    lo, hi = min(lo, hi), max(lo, hi)
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi - lo <= 0:
        return 1.0, [], 1.0, []
    step = nice_step(hi - lo, max(1, count))
    first = math.ceil(lo / step - 1e-9)
    major = [k * step for k in range(first, math.floor(hi / step + 1e-9) + 1)]
    m = step / (4 if round(step / 10.0 ** math.floor(math.log10(step)), 6) == 2 else 5)
    minor = [k * m for k in range(math.ceil(lo / m - 1e-9), math.floor(hi / m + 1e-9) + 1)]
    minor = [v for v in minor if all(abs(v - t) > m * 1e-3 for t in major)]
    return step, [0.0 if abs(v) < step * 1e-9 else v for v in major], m, minor


def log_ticks(lo10: float, hi10: float, room: int) -> tuple[list, list]:
    """Ticks of a log axis over [10^lo10, 10^hi10] as log10 positions: (labelled, unlabelled). At most about
    `room` labels: every decade (or every 2nd, 3rd ... when there are many), with 2 and 5 (or every digit)
    between them when there is room; the other mantissas are unlabelled minor ticks while a decade has room."""
    lo10, hi10 = min(lo10, hi10), max(lo10, hi10)
    if not (math.isfinite(lo10) and math.isfinite(hi10)) or hi10 - lo10 <= 0:
        return [], []
    room = max(2, int(room))
    e0, e1 = math.floor(lo10), math.ceil(hi10)
    inside = lambda v: lo10 - 1e-9 <= v <= hi10 + 1e-9  # noqa: E731
    candidates = [(1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 5), (1, 3), (1,)]
    labelled = []
    for mants in candidates:
        vals = [e + math.log10(m) for e in range(e0, e1 + 1) for m in mants if inside(e + math.log10(m))]
        if len(vals) <= room and len(vals) >= 2:
            labelled = vals
            break
        if mants == (1,):
            # many decades: every k-th decade
            decades = [float(e) for e in range(e0, e1 + 1) if inside(e)]
            k = max(1, math.ceil(len(decades) / room))
            labelled = [d for d in decades if int(round(d)) % k == 0] or decades[:1]
    if len(labelled) < 2:  # less than a decade with fewer than two round mantissas in it: every digit
        labelled = [e + math.log10(m) for e in range(e0, e1 + 1) for m in range(1, 10) if inside(e + math.log10(m))]
    if len(labelled) < 2:  # a narrow range: round linear steps of the values (100, 120, 140 ...)
        _s, major, _m, _minor = linear_ticks(10.0 ** lo10, 10.0 ** hi10, room)
        labelled = [math.log10(v) for v in major if v > 0]
    decades_shown = hi10 - lo10
    minor = []
    if decades_shown <= room:  # a decade is at least a label's room: its mantissas as unlabelled ticks
        minor = [e + math.log10(m) for e in range(e0, e1 + 1) for m in range(1, 10) if inside(e + math.log10(m))]
        minor = [v for v in minor if all(abs(v - t) > 1e-6 for t in labelled)]
    return labelled, minor


def common_prefix(values, unit: str) -> tuple[float, str, str]:
    """(factor, title suffix, tick suffix) for writing a linear axis's ticks with one prefix: the prefix of the
    largest magnitude goes into the title ("ms"). Unitless ticks below 0.001 share a power of ten in the title
    ("x10^-4"); counts of 10000 and more carry k, M, G on each tick ("20k")."""
    peak = max((abs(float(v)) for v in values), default=0.0)
    if unit:
        f, p = si_prefix(peak)
        return f, f"{p}{unit}", ""
    if peak == 0 or 1e-3 <= peak < 1e4:
        return 1.0, "", ""
    if peak >= 1e4:
        f, p = si_prefix(peak)
        return f, "", p
    e = math.floor(math.log10(peak))
    return 10.0 ** e, f"\u00d710{str(e).translate(SUPERSCRIPT)}", ""


def tick_texts(values, step: float, factor: float, letter: str = "") -> list[str]:
    """Linear ticks divided by `factor`, with as many decimals as the step needs (no more); `letter` (an SI
    prefix of a count) after every tick but 0."""
    s = step / factor
    decimals = next((d for d in range(13) if abs(round(s, d) - s) <= abs(s) * 1e-6), 12) if s > 0 else 0
    out = [_trim(f"{v / factor:.{decimals}f}") for v in values]
    return [t + letter if letter and t != "0" else t for t in out]


def log_tick_texts(positions, unit: str = "", scale: float = 1.0) -> list[str]:
    """The labels of a log axis's ticks at log10 positions (values 10^v * scale): each with its SI prefix and
    unit ("10 ms"); unitless, plain numbers while every one lies in 0.001..10000, else powers of ten for all
    ("10⁻⁶", "2·10⁻⁶") so that one axis never mixes the two."""
    xs = [10.0 ** v * scale for v in positions]
    if unit:
        return [si(x, unit, 3) for x in xs]
    if all(1e-3 <= x < 1e4 for x in xs):
        return [mantissa(x, 3) for x in xs]
    out = []
    for x in xs:
        e = math.floor(math.log10(x) + 1e-9)
        m = round(x / 10.0 ** e, 3)
        if m >= 10:
            e, m = e + 1, m / 10
        power = f"10{str(e).translate(SUPERSCRIPT)}"
        out.append(power if abs(m - 1) < 1e-6 else f"{mantissa(m, 2)}\u00b7{power}")
    return out
