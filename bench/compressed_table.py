#!/usr/bin/env python3
"""Markdown table from compressed_attention_bench's JSON (--benchmark_out): per shape, each
variant's CPU time per step, its bytes per token and its speed against the f32 pair path."""
import json
import sys

runs = json.load(open(sys.argv[1]))["benchmarks"]
rows = {}
for r in runs:
    if r.get("run_type") == "aggregate":
        continue
    args = dict(part.split(":") for part in r["name"].split("/")[1:])
    key = (int(args["dim"]), int(args["window"]), int(args["kv_heads"]))
    rows.setdefault(key, {})[r["label"]] = (r["cpu_time"], r["bytes_per_token"])
names = ["f32", "tq4", "tq4qjl", "tq3", "tq2", "int8"]
print("| D | W | kv_heads | " + " | ".join(names) + " |")
print("| --- | --- | --- | " + " | ".join("---" for _ in names) + " |")
for key in sorted(rows):
    base = rows[key]["f32"][0]
    cells = []
    for n in names:
        t, b = rows[key][n]
        cells.append(f"{t:,.0f} µs, {b:,.0f} B/tok" + ("" if n == "f32" else f", ×{base / t:.2f}"))
    print(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
