#!/usr/bin/env python3
"""Prints the attention benchmark's JSON (scripts/bench) as the markdown table of bench/README.md."""
import json
import re
import sys

# ggml's CPU flash attention on this machine type, 1 thread, hot cache, 8 query heads, f32 K/V
# (figures from issue 4), in microseconds.
GGML_US = {(128, 4096, 8): 1170.0, (128, 4096, 2): 1140.0, (128, 256, 8): 52.0}


def load(path):
    with open(path) as f:
        doc = json.load(f)
    runs = {}
    for b in doc["benchmarks"]:
        # With repetitions keep the fastest (aggregate "min"); without, the single run.
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "min":
            continue
        m = re.match(r"decode/D:(\d+)/W:(\d+)/kv:(\d+)/(\w+)", b["name"])
        if not m:
            continue
        d, w, kv, variant = int(m[1]), int(m[2]), int(m[3]), m[4]
        if b.get("run_type") == "aggregate" or (d, w, kv, variant) not in runs:
            runs[(d, w, kv, variant)] = b
    return doc.get("context", {}), runs


def micros(b):
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[b["time_unit"]]
    return b["real_time"] * scale


def main(path):
    context, runs = load(path)
    shapes = sorted({k[:3] for k in runs}, key=lambda s: (s[0], s[1], -s[2]))
    print(f"{context.get('num_cpus', '?')} CPUs at {context.get('mhz_per_cpu', '?')} MHz, "
          f"load average {context.get('load_avg', '?')}; times are the fastest repetition.\n")
    print("| D | W | kv heads | K+V MB | roof µs (GB/s) | ringkv pair µs (× roof, GB/s) "
          "| gather + attend µs (× roof) | scalar two-pass µs (× roof) | ggml µs |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for d, w, kv in shapes:
        row = {v: runs.get((d, w, kv, v)) for v in ("roof", "pair", "gathered", "scalar")}
        if not row["roof"]:
            continue
        kv_bytes = row["roof"]["kv_bytes"]
        roof = micros(row["roof"])

        def cell(v, gbps=False):
            b = row[v]
            if not b:
                return "–"
            t = micros(b)
            extra = f", {kv_bytes / t / 1e3:.0f}" if gbps else ""
            return f"{t:,.1f} ({t / roof:.2f}×{extra})"

        ggml = GGML_US.get((d, w, kv))
        print(f"| {d} | {w} | {kv} | {kv_bytes / 1e6:.1f} | {roof:,.1f} ({kv_bytes / roof / 1e3:.0f}) "
              f"| {cell('pair', True)} | {cell('gathered')} | {cell('scalar')} "
              f"| {f'{ggml:,.0f}' if ggml else '–'} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/bench/attention.json")
