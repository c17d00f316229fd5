#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on the shapes `flashvk bench --json` timed, on the same
GPU in the same run, through its flash and cuDNN backends (torch.nn.attention.sdpa_kernel), and
flashvk's time over each of theirs.

Times are CUDA events around one call, the median of --repeat calls; with the caches flushed
before each call (a 256 MiB buffer zeroed) when flashvk's run flushed them (its "cache_flush"),
back to back otherwise, as flashvk's bench did. Only what both run is timed: Q, K and V in fp16 or
bf16 alike, no modifier but causal (and causal only where Nq = Nk: PyTorch aligns the causal
mask top-left, flashvk bottom-right). Query heads share KV heads through enable_gqa; a backend
that refuses it is timed again with K and V repeated to every query head, its ratio marked *.

Usage: scripts/sdpa_bench.py FLASHVK.json... [--repeat N] [--json OUT]
Without torch or a CUDA device it prints one line saying so and exits 0 (gpu_bench.sh runs it
where it can).
"""
import argparse
import json
import statistics
import sys


def flashvk_rows(paths):
    """(file, row, cold) for each row of each flashvk bench JSON."""
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        for row in doc["results"]:
            yield path, row, bool(doc.get("cache_flush", True))


def comparable(row):
    """Why PyTorch cannot run this row as flashvk did, or None."""
    if row["dtype"] not in ("f16", "bf16") or row["kv_dtype"] != row["dtype"]:
        return "storage %s/%s" % (row["dtype"], row["kv_dtype"])
    mods = [m for m in ("softcap", "chunk") if row.get(m)]
    mods += [m for m in ("alibi", "sinks", "mask") if row.get(m)]
    if row.get("window", [-1, -1]) != [-1, -1]:
        mods.append("window")
    if row.get("score_mod") or row.get("mask_mod"):
        mods.append("user functions")
    if mods:
        return "modifiers " + ",".join(mods)
    if row.get("causal") and row["nq"] != row["nk"]:
        return "causal with Nq != Nk (PyTorch aligns it top-left)"
    return None


def time_sdpa(torch, backend, row, cold, repeat, expand=False):
    """Median ms of SDPA on `backend` for the row's shape; raises where the backend refuses.
    `expand`: K and V repeated to every query head instead of enable_gqa (for a backend without
    GQA; it reads H / Hkv times the bytes)."""
    from torch.nn.attention import sdpa_kernel
    import torch.nn.functional as F

    dtype = torch.float16 if row["dtype"] == "f16" else torch.bfloat16
    b, h, hkv = row["batch"], row["heads"], row["kv_heads"]
    nq, nk, d, dv = row["nq"], row["nk"], row["d"], row["dv"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, h, nq, d, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(b, hkv, nk, d, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(b, hkv, nk, dv, device="cuda", dtype=dtype, generator=gen)
    flush = torch.empty(256 << 20, device="cuda", dtype=torch.uint8) if cold else None
    kwargs = {"is_causal": bool(row.get("causal"))}
    if h != hkv and expand:
        k = k.repeat_interleave(h // hkv, dim=1)
        v = v.repeat_interleave(h // hkv, dim=1)
    elif h != hkv:
        kwargs["enable_gqa"] = True
    times = []
    with sdpa_kernel([backend]):
        F.scaled_dot_product_attention(q, k, v, **kwargs)  # builds and checks the kernel
        torch.cuda.synchronize()
        for _ in range(repeat):
            if flush is not None:
                flush.zero_()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            F.scaled_dot_product_attention(q, k, v, **kwargs)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def fmt(ms):
    if ms is None:
        return "-"
    return "%.2f us" % (ms * 1e3) if ms < 1 else "%.3f ms" % ms


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("flashvk_json", nargs="+", help="files of flashvk bench --json")
    ap.add_argument("--repeat", type=int, default=21)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401 (torch >= 2.3)
    except ImportError as e:
        print("sdpa_bench: skipped: no PyTorch with torch.nn.attention.sdpa_kernel (%s)" % e)
        return 0
    if not torch.cuda.is_available():
        print("sdpa_bench: skipped: PyTorch %s sees no CUDA device" % torch.__version__)
        return 0
    backends = [("flash", SDPBackend.FLASH_ATTENTION)]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        backends.append(("cudnn", SDPBackend.CUDNN_ATTENTION))
    print("sdpa_bench: PyTorch %s, %s; flashvk's time over each backend's" %
          (torch.__version__, torch.cuda.get_device_name()))
    head = "%-7s %-5s %3s %4s %4s %6s %6s %4s %-5s %13s" % (
        "cache", "dtype", "B", "H", "Hkv", "Nq", "Nk", "d", "mask", "flashvk")
    for name, _ in backends:
        head += " %13s %9s" % (name, "ratio")
    print(head)
    out = []
    for path, row, cold in flashvk_rows(args.flashvk_json):
        if row["variant"] not in ("flash2", "splitkv", "flashd", "flash1"):
            continue
        why = comparable(row)
        label = "%-7s %-5s %3d %4d %4d %6d %6d %4d %-5s %13s" % (
            "cold" if cold else "warm", row["dtype"], row["batch"], row["heads"],
            row["kv_heads"], row["nq"], row["nk"], row["d"],
            "causal" if row.get("causal") else "full", fmt(row["ms"]))
        if why:
            print(label + "  not compared: " + why)
            continue
        entry = {"flashvk_json": path, "variant": row["variant"], "cold": cold,
                 "shape": {k: row[k] for k in ("batch", "heads", "kv_heads", "nq", "nk", "d",
                                               "dv", "dtype")},
                 "causal": bool(row.get("causal")), "flashvk_ms": row["ms"]}
        line = label
        for name, backend in backends:
            ms = None
            for expand in (False, True) if row["heads"] != row["kv_heads"] else (False,):
                try:
                    ms = time_sdpa(torch, backend, row, cold, args.repeat, expand)
                    if expand:
                        entry[name + "_note"] = "no GQA: K and V expanded to every query head"
                    break
                except Exception as e:  # a backend that refuses the shape: say which and why
                    text = str(e).splitlines()[0] if str(e) else type(e).__name__
                    entry[name + "_error" + ("_expanded" if expand else "")] = text
            if ms is None:
                line += " %13s %9s" % ("refused", "-")
                continue
            entry[name + "_ms"] = ms
            entry["flashvk_over_" + name] = row["ms"] / ms
            line += " %13s %7.2fx%s" % (fmt(ms), row["ms"] / ms, "*" if expand else " ")
        print(line + " " + row["variant"])
        for name, _ in backends:
            for key in (name + "_error", name + "_error_expanded"):
                if key in entry and name + "_ms" not in entry:
                    print("    %s: %s" % (key.replace("_", " "), entry[key][:160]))
            if name + "_note" in entry:
                print("    %s*: %s" % (name, entry[name + "_note"]))
        sys.stdout.flush()
        out.append(entry)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(),
                       "rows": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
