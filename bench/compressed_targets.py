#!/usr/bin/env python3
"""The compressed decode step against ringkv's f16 path, over several processes: runs
compressed_attention_bench once per shape and round (rounds alternate the shapes), each run every
variant of the shape with interleaved repetitions; each ratio comes from one process's fastest
repetitions, a cell gives its median over the rounds (min–max) and a verdict.

    compressed_targets.py [--bench PATH] [--rounds N] [--reps N] [--min-time S] [--shapes REGEX]
                          [--variants REGEX]

Targets, where the f16 window's K+V exceed a core's L2: tq4 ÷ f16 ≤ 1 (and ≤ 1 / 1.5 at
W 32768), fp8 ÷ f16 ≤ 1 (half the bytes), int8 ÷ f16 ≤ 1 (out of reach, "out", where the int8
rows' floor, floor_int8, is slower than f16), tq3 ÷ tq4 and tq2 ÷ tq4 ≤ 1, and 2 threads ÷ 1 ≥ 1.7× (a variant's 1-thread
time over its 2-thread time; int8 out of reach, "out", where its 1-thread time over the 2-thread
time of merely reading its bytes, read_int8, is under 1.7)."""
import argparse
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import l2_bytes, micros, run_interleaved  # noqa: E402

GRID = [(d, w, kv) for d in (64, 128) for w in (256, 4096, 32768) for kv in (8, 2)]
KINDS = ["f32", "f16", "fp8", "tq4", "tq3", "tq2", "tq4qjl", "int8", "floor_int8", "read_int8"]
FLOORS = ("floor_int8", "read_int8")
FASTER_AT_32768, SPEEDUP = 1.5, 1.7


def run_shape(bench, shape, variants, reps, min_time):
    """{variant: fastest repetition (µs)} of one process over `shape`, its f16 K+V bytes and the
    L2 bytes a core (from the JSON's context)."""
    d, w, kv = shape
    pattern = f"^compressed/D:{d}/W:{w}/kv:{kv}/({'|'.join(variants)})/"
    doc = run_interleaved(bench, pattern, reps, min_time, lambda path: json.load(open(path)))
    runs, f16_bytes = {}, 0
    for b in doc["benchmarks"]:
        if b.get("aggregate_name") != "min":
            continue
        name = b["name"].split("/")[4]
        runs[name] = micros(b)
        if name == "f16":
            f16_bytes = b["kv_bytes"]
    return runs, f16_bytes, l2_bytes(doc["context"])


def spread(values):
    return (f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"
            if values else "–")


def ratios(rounds, a, b):
    return [r[a] / r[b] for r in rounds if a in r and b in r]


def mark(values, ok):
    return "" if not values else (" **met**" if ok(statistics.median(values)) else " miss")


def table(shapes, rounds, past_l2):
    """One row per shape and thread count: each compressed variant ÷ f16 (time), the bit widths
    against tq4, and the median µs of f16 and tq4."""
    compressed = [k for k in KINDS if k not in ("f32", "f16")]
    lines = ["| D / W / kv | threads | f16 µs | tq4 µs | " +
             " | ".join(f"{k} ÷ f16" for k in ["f32"] + compressed) +
             " | tq3 ÷ tq4 | tq2 ÷ tq4 |",
             "| --- | --: | --: | --: |" + " --: |" * (len(compressed) + 3)]
    for shape in shapes:
        big = past_l2[shape]
        limit = 1 / FASTER_AT_32768 if shape[1] == 32768 else 1.0
        for threads in (1, 2):
            t = "" if threads == 1 else "_2"
            got = rounds[shape]
            cells = []
            floor = ratios(got, "floor_int8" + t, "f16" + t)
            for k in ["f32"] + compressed:
                r = ratios(got, k + t, "f16" + t)
                goal = {"tq4": limit, "int8": 1.0, "fp8": 1.0}.get(k)
                verdict = mark(r, lambda m, g=goal: m <= g) if big and goal else ""
                # int8 out of reach where even its floor is slower than f16
                if k == "int8" and verdict == " miss" and floor and statistics.median(floor) > 1:
                    verdict = " out"
                cells.append(spread(r) + verdict)
            for k in ("tq3", "tq2"):
                r = ratios(got, k + t, "tq4" + t)
                cells.append(spread(r) + (mark(r, lambda m: m <= 1.0) if big else ""))
            us = [f"{statistics.median([r[v + t] for r in got if v + t in r]):,.0f}"
                  if any(v + t in r for r in got) else "–" for v in ("f16", "tq4")]
            lines.append(f"| {' / '.join(map(str, shape))} | {threads} | {us[0]} | {us[1]} | " +
                         " | ".join(cells) + " |")
    return "\n".join(lines)


def speedups(shapes, rounds, past_l2):
    """2 threads ÷ 1 (1-thread time over 2-thread time) per variant, where f16 is past the L2."""
    lines = ["| D / W / kv | " + " | ".join(KINDS) + " |", "| --- |" + " --: |" * len(KINDS)]
    for shape in shapes:
        if not past_l2[shape]:
            continue
        cells = []
        for k in KINDS:
            r = ratios(rounds[shape], k, k + "_2")
            verdict = "" if k in ("f32", "f16") + FLOORS else mark(r, lambda m: m >= SPEEDUP)
            # the most a second thread can give int8: its 1-thread time ÷ a bare read's on 2
            bound = ratios(rounds[shape], k, "read_int8_2")
            if k == "int8" and verdict == " miss" and bound and statistics.median(bound) < SPEEDUP:
                verdict = f" out (≤ {statistics.median(bound):.2f})"
            cells.append(spread(r) + verdict)
        lines.append(f"| {' / '.join(map(str, shape))} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("--bench", default="build/release/bench/compressed_attention_bench")
    a.add_argument("--rounds", type=int, default=5)
    a.add_argument("--reps", type=int, default=5)
    a.add_argument("--min-time", default="0.1")
    a.add_argument("--shapes", default=".", help="regex over 'D/W/kv', e.g. '^64/4096/'")
    a.add_argument("--variants", default=".", help="regex over the variants' names")
    args = a.parse_args()
    shapes = [s for s in GRID if re.search(args.shapes, "/".join(map(str, s)))]
    variants = [k + t for t in ("", "_2") for k in KINDS if re.search(args.variants, k + t)]
    for must in ("f16", "f16_2"):
        if must not in variants:
            variants.append(must)
    rounds, past_l2 = {s: [] for s in shapes}, {}
    for k in range(args.rounds):
        for shape in shapes:
            runs, f16_bytes, l2 = run_shape(args.bench, shape, variants, args.reps, args.min_time)
            rounds[shape].append(runs)
            past_l2[shape] = f16_bytes > l2
        print(f"round {k + 1} of {args.rounds} done", file=sys.stderr)
    print(f"{args.rounds} rounds × {args.reps} interleaved repetitions a shape; each ratio from "
          "one process's fastest repetitions; median (min–max) over the rounds. Verdicts where "
          "f16's K+V exceed the L2.\n")
    print(table(shapes, rounds, past_l2))
    print()
    print(speedups(shapes, rounds, past_l2))


if __name__ == "__main__":
    main()
