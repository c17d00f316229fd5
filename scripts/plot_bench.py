#!/usr/bin/env python3
"""Charts for docs/performance.md from `flashvk bench --suite standard --peak --json FILE`.

Writes SVG files (no dependencies beyond Python 3):
  prefill_time.svg    time against N per variant (prefill, fp32, d=64, full)
  prefill_memory.svg  device memory against N per variant (same runs)
  peak_fraction.svg   fraction of the FMA peak (calibrated next to each case) per variant at
                      N=4096 (fp32, full)
  coopmat_fraction.svg  the same for the cooperative-matrix rows (fp16), against the matrix
                      peak; only when the run has such rows
  decode_per_key.svg  decode time per key against Nk
  flashd_vs_flash2.svg  flashd's time over flash2's (median of round-by-round ratios) against N,
                      one line per dtype, head dim and mask

usage: python3 scripts/plot_bench.py suite.json OUT_DIR
"""
import json
import math
import sys
from pathlib import Path

COLORS = {"naive": "#d62728", "online": "#9467bd", "flash1": "#8c564b",
          "flash2": "#1f77b4", "flashd": "#2ca02c", "splitkv": "#ff7f0e"}
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
W, H, L, R, T, B = 640, 360, 70, 110, 40, 50  # size and margins


def svg(title, body, xlabel, ylabel):
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
            f'font-family="sans-serif" font-size="12">\n'
            f'<rect width="{W}" height="{H}" fill="white"/>\n'
            f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>\n'
            f'<text x="{L + (W - L - R) / 2}" y="{H - 10}" text-anchor="middle">{xlabel}</text>\n'
            f'<text x="16" y="{T + (H - T - B) / 2}" text-anchor="middle" '
            f'transform="rotate(-90 16 {T + (H - T - B) / 2})">{ylabel}</text>\n'
            + body + "</svg>\n")


def line_chart(title, series, xlabel, ylabel, log_y=True, refs=(), y_range=None):
    xs = sorted({x for pts in series.values() for x, _ in pts})
    ys = [y for pts in series.values() for _, y in pts if y > 0]
    lo, hi = min(ys), max(ys)
    if log_y:
        lo, hi = 10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi))
    else:
        lo, hi = 0, hi * 1.1
    if y_range:
        lo, hi = y_range
    fy = (lambda y: math.log10(y)) if log_y else (lambda y: y)
    px = lambda x: L + (W - L - R) * (xs.index(x) / max(1, len(xs) - 1))
    py = lambda y: H - B - (H - T - B) * (fy(y) - fy(lo)) / (fy(hi) - fy(lo))
    body = f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" fill="none" stroke="#888"/>\n'
    ticks = [10 ** e for e in range(int(math.log10(lo)), int(math.log10(hi)) + 1)] if log_y \
        else [lo + (hi - lo) * i / 5 for i in range(6)]
    for t in ticks:
        body += (f'<line x1="{L}" x2="{W - R}" y1="{py(t)}" y2="{py(t)}" stroke="#eee"/>'
                 f'<text x="{L - 6}" y="{py(t) + 4}" text-anchor="end">{t:.3g}</text>\n')
    for ref in refs:
        body += (f'<line x1="{L}" x2="{W - R}" y1="{py(ref)}" y2="{py(ref)}" stroke="#d62728" '
                 f'stroke-dasharray="6 4"/>\n')
    for x in xs:
        body += f'<text x="{px(x)}" y="{H - B + 16}" text-anchor="middle">{x}</text>\n'
    for i, (name, pts) in enumerate(series.items()):
        color = COLORS.get(name, PALETTE[i % len(PALETTE)])
        pts = sorted(p for p in pts if p[1] > 0)
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        body += f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>\n'
        for x, y in pts:
            body += f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>\n'
        body += (f'<rect x="{W - R + 12}" y="{T + 18 * i}" width="12" height="12" fill="{color}"/>'
                 f'<text x="{W - R + 30}" y="{T + 18 * i + 11}">{name}</text>\n')
    return svg(title, body, xlabel, ylabel)


def bar_chart(title, bars, ylabel):
    hi = max(max(v for _, v in bars) * 1.15, 0.1)
    bw = (W - L - R) / len(bars)
    body = f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" fill="none" stroke="#888"/>\n'
    for i in range(6):
        t = hi * i / 5
        y = H - B - (H - T - B) * t / hi
        body += (f'<line x1="{L}" x2="{W - R}" y1="{y}" y2="{y}" stroke="#eee"/>'
                 f'<text x="{L - 6}" y="{y + 4}" text-anchor="end">{100 * t:.0f}%</text>\n')
    for i, (name, v) in enumerate(bars):
        h = (H - T - B) * v / hi
        x = L + i * bw + bw * 0.15
        body += (f'<rect x="{x:.1f}" y="{H - B - h:.1f}" width="{bw * 0.7:.1f}" height="{h:.1f}" '
                 f'fill="{COLORS.get(name.split()[0], "#333")}"/>'
                 f'<text x="{x + bw * 0.35:.1f}" y="{H - B - h - 4:.1f}" text-anchor="middle">'
                 f'{100 * v:.1f}%</text>'
                 f'<text x="{x + bw * 0.35:.1f}" y="{H - B + 16}" text-anchor="middle">{name}</text>\n')
    return svg(title, body, "", ylabel)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    data = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    rows = data["results"]
    device = data["device"]
    pre = [r for r in rows if r.get("kind") == "prefill" and r["dtype"] == "f32" and r["d"] == 64
           and not r["causal"]]
    by = {}
    for r in pre:
        by.setdefault(r["variant"], []).append((r["nq"], r["ms"]))
    (out / "prefill_time.svg").write_text(line_chart(
        f"Prefill time, B=1 H=8 d=64 fp32 ({device})", by, "N = Nq = Nk", "ms (log)"))
    mem = {}
    for r in pre:
        mem.setdefault(r["variant"], []).append((r["nq"], r["device_bytes"] / 2 ** 20))
    (out / "prefill_memory.svg").write_text(line_chart(
        "Device memory per call (outputs and scratch)", mem, "N = Nq = Nk", "MiB (log)"))
    if "peak" in data:
        bars = [(f'{r["variant"]} d{r["d"]}', r["peak_fraction"]) for r in rows
                if r.get("kind") == "prefill" and r["dtype"] == "f32" and r["nq"] == 4096
                and not r["causal"]]
        (out / "peak_fraction.svg").write_text(bar_chart(
            "Fraction of the FMA peak measured next to each case, N=4096 fp32", bars,
            "of peak"))
        matrix = [(f'{r["variant"]} d{r["d"]}', r["peak_fraction"]) for r in rows
                  if r.get("kind") == "prefill" and r["nq"] == 4096 and not r["causal"]
                  and r.get("tile_layout") == "cooperative_matrix"]
        if matrix:
            (out / "coopmat_fraction.svg").write_text(bar_chart(
                "Fraction of the fp16 matrix peak, N=4096 fp16 (cooperative matrices)", matrix,
                "of peak"))
    dec = {}
    for r in rows:
        if r.get("kind") == "decode" and r["dtype"] == "f32":
            dec.setdefault(r["variant"], []).append((r["nk"], 1000 * r["ms"] / r["nk"]))
    (out / "decode_per_key.svg").write_text(line_chart(
        "Decode time per key, Nq=1 H=32 Hkv=8 d=128 fp32", dec, "Nk", "us per key", log_y=False))
    ratio = {}
    for r in rows:
        if r.get("kind") == "prefill" and r["variant"] == "flashd" and "vs_flash2" in r:
            name = f'{r["dtype"]} d{r["d"]} {"causal" if r["causal"] else "full"}'
            ratio.setdefault(name, []).append((r["nq"], r["vs_flash2"]))
    if ratio:
        top = max(1.3, max(y for pts in ratio.values() for _, y in pts) * 1.05)
        (out / "flashd_vs_flash2.svg").write_text(line_chart(
            "flashd time / flash2 time (median of rounds), dashed: 0.9 and 1.1", ratio,
            "N = Nq = Nk", "time ratio", log_y=False, refs=(0.9, 1.1), y_range=(0.5, top)))


if __name__ == "__main__":
    main()
