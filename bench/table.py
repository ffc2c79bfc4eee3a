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
          "| gather + attend µs (× roof) | scalar two-pass µs (× roof) | ggml µs "
          "| 2-byte roof µs (GB/s) | f16 pair µs (× 2-byte roof, × f32 pair) "
          "| bf16 pair µs (× 2-byte roof, × f32 pair) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    variants = ("roof", "pair", "gathered", "scalar", "roof16", "pair_f16", "pair_bf16")
    for d, w, kv in shapes:
        row = {v: runs.get((d, w, kv, v)) for v in variants}
        if not row["roof"]:
            continue
        kv_bytes = row["roof"]["kv_bytes"]

        def cell(v, gbps=False, against="roof", versus=None):
            b, r = row[v], row[against]
            if not b or not r:
                return "–"
            t = micros(b)
            extra = f", {r['kv_bytes'] / t / 1e3:.0f}" if gbps else ""
            if versus and row[versus]:
                extra += f", {t / micros(row[versus]):.2f}×"
            return f"{t:,.1f} ({t / micros(r):.2f}×{extra})"

        def roof_cell(v):
            b = row[v]
            return f"{micros(b):,.1f} ({b['kv_bytes'] / micros(b) / 1e3:.0f})" if b else "–"

        ggml = GGML_US.get((d, w, kv))
        print(f"| {d} | {w} | {kv} | {kv_bytes / 1e6:.1f} | {roof_cell('roof')} "
              f"| {cell('pair', True)} | {cell('gathered')} | {cell('scalar')} "
              f"| {f'{ggml:,.0f}' if ggml else '–'} | {roof_cell('roof16')} "
              f"| {cell('pair_f16', against='roof16', versus='pair')} "
              f"| {cell('pair_bf16', against='roof16', versus='pair')} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/bench/attention.json")
