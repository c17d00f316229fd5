#!/usr/bin/env python3
"""Issue #43's speed targets, judged from one gpu_bench.sh run's files: each target, what the
run measured, and met / NOT MET / no data.

Reads OUT/prefill_f16_D*.json (flash2 and flashd, full and causal; prefill_nv2_f16_D*.json the
same through --matrix-api nv2, prefill_as_built_f16_D.json the full ones with the SPIR-V as
glslang built it), OUT/sdpa.json (PyTorch's SDPA on the same shapes, flash backend =
FlashAttention-2), OUT/modifiers_f16.json (bench --suite modifiers in fp16),
OUT/tiles_API_D_KEYS.json (flash2 at each tile size, in the default matrix API and nv2), each
set against the tile the engine chose, OUT/rows_D_32.json (flash2's row blocks split over two
groups), OUT/rows_D_128.json (workgroups of 128 rows) and OUT/groups_D_R.json (32 rows a group,
R a workgroup) set against the engine's rows,
OUT/skip_D_PHASES.json (flash2 with phases of the matrix kernel left out; skip_D_none.json: the
whole kernel, which the others are set against), and OUT/pipelines_f16_D.json (the driver's
statistics of the prefill shapes' pipelines: the matrix kernels' registers and spills). A
target "on the matrix path" is judged only on rows that ran the cooperative-matrix kernel; a run
on other tiles says so instead. The targets are for N = 4096 (gpu_bench.sh's shapes; --tiny's
are smaller), whose N the table's first line gives. Prints the table (and writes it to --out);
exits 0 whatever the verdicts, 2 where OUT cannot be read.

Usage: scripts/gpu_targets.py OUT [--out FILE]
"""
import argparse
import glob
import json
import os
import sys

MATRIX = "cooperative_matrix"


def load(path):
    """The JSON at path, or None where there is no such file."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def prefill_rows(out, prefix=""):
    """The rows of the prefill files: the default's (khr, the SPIR-V rewritten), or with
    prefix "nv2_" nv2's, with "as_built_" the SPIR-V as glslang built it."""
    rows = []
    for path in sorted(glob.glob(os.path.join(out, "prefill_%sf16_*.json" % prefix))):
        rows += load(path)["results"]
    return rows


def against(name, mine, base, verdict):
    """Row `name` setting bench row `mine` against `base` (either may be None): no data, not
    on the matrix path, or the ratio of their times and verdict(ratio)."""
    if mine is None or base is None:
        return (name, "-", "no data")
    if mine["tile_layout"] != MATRIX or base["tile_layout"] != MATRIX:
        return (name, "-", "not on the matrix path (%s, %s)" %
                (mine["tile_layout"], base["tile_layout"]))
    x = mine["ms"] / base["ms"]
    return (name, "%.2fx" % x, verdict(x))


def find(rows, **want):
    """The first row whose fields equal `want` (None: none)."""
    for r in rows:
        if all(r.get(k) == v for k, v in want.items()):
            return r
    return None


def judge(value, limit):
    return "met" if value <= limit else "NOT MET"


def evaluate(out):
    """[(target, measured, verdict)] for the run in directory `out`."""
    results = []
    prefill = prefill_rows(out)
    sdpa = load(os.path.join(out, "sdpa.json"))
    mods = load(os.path.join(out, "modifiers_f16.json"))
    mod_rows = mods["results"] if mods else []

    for d in (64, 128):
        name = "d=%d full: flashvk <= 2x FlashAttention-2 (SDPA flash)" % d
        row = None
        if sdpa:
            row = next((r for r in sdpa["rows"] if r["variant"] == "flash2" and not r["causal"]
                        and r["shape"]["d"] == d and "flashvk_over_flash" in r), None)
        if row is None:
            results.append((name, "-", "no data"))
        else:
            x = row["flashvk_over_flash"]
            results.append((name, "%.2fx (%.3f ms / %.3f ms)" % (x, row["flashvk_ms"],
                                                                   row["flash_ms"]),
                            judge(x, 2.0)))
    for d in (64, 128):
        name = "d=%d: causal <= 0.6x full (flash2)" % d
        full = find(prefill, variant="flash2", d=d, causal=False)
        causal = find(prefill, variant="flash2", d=d, causal=True)
        if full is None or causal is None:
            results.append((name, "-", "no data"))
        else:
            x = causal["ms"] / full["ms"]
            results.append((name, "%.2fx" % x, judge(x, 0.6)))

    def on_matrix(name, rows, value, limit):
        if any(r is None for r in rows):
            results.append((name, "-", "no data"))
        elif any(r["tile_layout"] != MATRIX for r in rows):
            results.append((name, "%.2fx" % value,
                            "not on the matrix path (%s)" % rows[0]["tile_layout"]))
        else:
            results.append((name, "%.2fx" % value, judge(value, limit)))

    def base_ratio(row):
        return row["vs_base"] if row else 0.0

    softcap = next((r for r in mod_rows if r["variant"] == "flash2" and r.get("softcap")), None)
    on_matrix("softcap <= 1.2x causal (flash2)", [softcap], base_ratio(softcap), 1.2)
    mask = find(mod_rows, variant="flash2", mask_name="causal")
    on_matrix("causal pattern as an additive mask <= 1.1x causal (flash2)", [mask],
              base_ratio(mask), 1.1)
    builtin = next((r for r in mod_rows if r["variant"] == "flash2" and r.get("alibi")
                    and not r.get("score_mod")), None)
    written = next((r for r in mod_rows if r["variant"] == "flash2"
                    and "alibi" in (r.get("score_mod") or "")), None)
    ratio = written["ms"] / builtin["ms"] if builtin and written else 0.0
    on_matrix("ALiBi as a score_mod <= 1.1x the built-in (flash2)", [written, builtin], ratio,
              1.1)

    for d in (64, 128):
        for causal in (False, True):
            name = "d=%d %s: flashd within 5%% of flash2" % (d, "causal" if causal else "full")
            row = find(prefill, variant="flashd", d=d, causal=causal)
            if row is None or "vs_flash2" not in row:
                results.append((name, "-", "no data"))
            else:
                results.append((name, "%.3fx" % row["vs_flash2"], judge(row["vs_flash2"], 1.05)))
    # Against the default (khr, the SPIR-V rewritten), each where gpu_bench.sh ran it: NVIDIA's
    # second extension where the device has it, and the SPIR-V as glslang built it
    # (FLASHVK_SPIRV_AS_BUILT=1: what engine/src/spirv.hpp's rewrite is worth), full shapes only.
    others = [("nv2_", "nv2's kernel against khr's", "nv2 wins", "khr wins", (False, True)),
              ("as_built_", "the SPIR-V as built against rewritten", "as built wins",
               "rewritten wins", (False,))]
    for prefix, what, faster, slower, masks in others:
        rows = prefill_rows(out, prefix)
        for d in (64, 128):
            for causal in masks:
                name = "d=%d %s: %s (flash2)" % (d, "causal" if causal else "full", what)
                mine = find(rows, variant="flash2", d=d, causal=causal)
                base = find(prefill, variant="flash2", d=d, causal=causal)
                results.append(against(name, mine, base,
                                       lambda x: faster if x < 1.0 else slower))
    # The tile sizes gpu_bench.sh swept (--block-keys) against the engine's own choice on the
    # same shape: the block_keys of flash2's full prefill row, default API or nv2.
    for api, prefix in (("default", ""), ("nv2", "nv2_")):
        for d in (64, 128):
            name = ("d=%d full, %s API: the engine's tile against 16, 32, 64 keys (flash2)"
                    % (d, api))
            swept = []
            for path in sorted(glob.glob(os.path.join(out, "tiles_%s_%d_*.json" % (api, d)))):
                swept += [r for r in load(path)["results"] if r["tile_layout"] == MATRIX]
            chosen = find(prefill_rows(out, prefix), variant="flash2", d=d, causal=False)
            if not swept or chosen is None:
                results.append((name, "-", "no data"))
                continue
            if chosen["tile_layout"] != MATRIX:  # the engine's choice is other tiles
                results.append((name, "-", "not on the matrix path (%s)" % chosen["tile_layout"]))
                continue
            swept.sort(key=lambda r: r["block_keys"])
            base = find(swept, block_keys=chosen["block_keys"]) or chosen
            measured = ", ".join("%d: %.2fx" % (r["block_keys"], r["ms"] / base["ms"])
                                 for r in swept)
            best = min(swept, key=lambda r: r["ms"])
            if best["block_keys"] == chosen["block_keys"] or best["ms"] >= base["ms"]:
                verdict = "the engine's %d keys win" % chosen["block_keys"]
            else:
                verdict = "%d keys win (engine: %d)" % (best["block_keys"], chosen["block_keys"])
            results.append((name, measured, verdict))
    # Row blocks split over two groups (--block-rows 32), and workgroups of twice the groups
    # (--block-rows 128), against the engine's 64 rows.
    for d, rows in ((64, 32), (128, 32), (64, 128), (128, 128)):
        what = "row blocks split (32 rows)" if rows == 32 else "128-row workgroups"
        name = "d=%d full: %s against the engine's (flash2)" % (d, what)
        path = os.path.join(out, "rows_%d_%d.json" % (d, rows))
        other = find(load(path)["results"], variant="flash2") if os.path.exists(path) else None
        chosen = find(prefill, variant="flash2", d=d, causal=False)

        def rows_verdict(x, other=other, chosen=chosen):
            won = x < 1.0 and other["block_rows"] != chosen["block_rows"]
            return ("%d rows win" % other["block_rows"] if won else
                    "the engine's %d rows win" % chosen["block_rows"])
        results.append(against(name, other, chosen, rows_verdict))
    # Two row matrices a group (--group-rows 32: each K and V matrix read from shared memory
    # for two products), at d = 64 in workgroups of 128 rows and of 64, at d = 128 of 64 (the
    # queries from shared memory), against the engine's 16 a group.
    for d, rows in ((64, 128), (64, 64), (128, 64)):
        name = "d=%d full: 32 rows a group, %d a workgroup, against the engine's (flash2)" % (
            d, rows)
        path = os.path.join(out, "groups_%d_%d.json" % (d, rows))
        other = find(load(path)["results"], variant="flash2") if os.path.exists(path) else None
        chosen = find(prefill, variant="flash2", d=d, causal=False)
        results.append(against(name, other, chosen, lambda x: "32 rows a group win" if x < 1.0
                               else "the engine's rows a group win"))
    # The prefill shapes' matrix kernels as the driver built them (pipelines_f16_D.json): no
    # register spilled and no local memory (NVIDIA's "Local Memory Size", the report's scratch).
    for d in (64, 128):
        name = "d=%d: the matrix kernels spill nothing, no local memory" % d
        path = os.path.join(out, "pipelines_f16_%d.json" % d)
        kernels = [p for p in load(path)["pipelines"] if p.get("layout") == MATRIX] \
            if os.path.exists(path) else []
        # A driver without statistics gives no summary, and one that names none as spills or
        # scratch gives null there: no data, never a zero.
        if not kernels or any((p.get("summary") or {}).get("scratch_bytes") is None
                              for p in kernels):
            results.append((name, "-", "no data"))
            continue

        def figures(p):
            s = p["summary"]
            spilled = s.get("spilled_registers") or 0
            return "%s: %d regs, %d B%s" % (p["program"], s.get("registers") or 0,
                                            s["scratch_bytes"],
                                            ", %d spilled" % spilled if spilled else "")
        measured = ", ".join(figures(p) for p in kernels)
        results.append((name, measured, "NOT MET" if any(p.get("spills") for p in kernels)
                        else "met"))
    # Where the matrix kernel's time goes: flash2 with phases left out (FLASHVK_MATRIX_SKIP),
    # against the whole kernel in the same flags (skip_D_none.json).
    for d in (64, 128):
        path = os.path.join(out, "skip_%d_none.json" % d)
        whole = find(load(path)["results"], variant="flash2") if os.path.exists(path) else None
        for path in sorted(glob.glob(os.path.join(out, "skip_%d_*.json" % d))):
            phases = os.path.basename(path)[len("skip_%d_" % d):-len(".json")].replace("+", ",")
            if phases == "none":
                continue
            name = "d=%d full: flash2 without %s (FLASHVK_MATRIX_SKIP)" % (d, phases)
            row = find(load(path)["results"], variant="flash2")
            if row is None or whole is None:
                results.append((name, "-", "no data"))
            else:
                results.append((name, "%.2fx (%.3f ms)" % (row["ms"] / whole["ms"], row["ms"]),
                                "of the whole kernel's time"))
    return results


def describe(out):
    """The prefill runs' device, commit and N, in words."""
    for path in sorted(glob.glob(os.path.join(out, "prefill_f16_*.json"))):
        doc = load(path)
        if doc["results"]:
            r = doc["results"][0]
            return "%s, commit %s, prefill B=%d H=%d N=%d" % (
                doc.get("device", "?"), doc.get("commit", "?"), r["batch"], r["heads"], r["nq"])
    return "no prefill files"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="gpu_bench.sh's output directory")
    ap.add_argument("--out", dest="file", help="also write the table here")
    args = ap.parse_args()
    if not os.path.isdir(args.out):
        print("gpu_targets: no directory %s" % args.out, file=sys.stderr)
        return 2
    try:
        results = evaluate(args.out)
    except (OSError, ValueError, KeyError) as e:
        print("gpu_targets: cannot read %s: %s" % (args.out, e), file=sys.stderr)
        return 2
    width = max(len(t) for t, _, _ in results)
    lines = ["run: %s" % describe(args.out)]
    lines += ["%-*s  %-30s %s" % (width, "target (issue #43)", "measured", "verdict")]
    lines += ["%-*s  %-30s %s" % (width, t, m, v) for t, m, v in results]
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.file:
        with open(args.file, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
