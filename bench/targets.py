#!/usr/bin/env python3
"""The decode-step targets over several processes (scripts/bench-targets): runs attention_bench
once per shape and round, rounds alternating the shapes, each run the shape's roofs, floors and
steps with interleaved repetitions; then, per target, the median over the rounds of each round's
ratio (fastest repetitions of the same process), its range, and a verdict.

    targets.py [--bench PATH] [--rounds N] [--reps N] [--min-time S] [--shapes REGEX]

Why: on a shared VM one report run's cells move by 1.3-1.9x between minutes, so a single table
can neither show a target met nor missed. A ratio taken within one process, where the step and
its roof ran interleaved in the same seconds, moves far less, and its median over processes
minutes apart is what the verdicts use.

Verdicts: 'met' where the median is within the target; 'out of reach' where the median of the
step's own floor (exp floor for f32 rows, the f16 floor for f16 rows: the least an exact step
does on those bytes) is already past it; 'missed' otherwise. For 2 threads ÷ 1, the "floor's"
column is the roofs' own ratio (roof ÷ roof2: what two threads add to the bandwidth) and the
verdict is 'out of reach' where 1.25 × that is under 1.7: a 1-thread step within 1.25× of its
roof, against a 2-thread step no faster than its roof, is then less than 1.7× slower, so the two
targets exclude each other."""
import argparse
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import (GGML_US, fastest_roofs, l2_bytes, load_attention, micros,  # noqa: E402
                    run_interleaved)

GRID = [(d, w, kv) for d in (64, 128) for w in (256, 4096, 32768) for kv in (8, 2)]
# (step, its floor, its roof, threads, rows): the roof is the faster of the name's two reads.
STEPS = [("pair", "floor_exp", "roof", 1, "f32"), ("pair2", "floor2_exp", "roof2", 2, "f32"),
         ("pair_f16", "floor_f16", "roof16", 1, "f16"),
         ("pair2_f16", "floor2_f16", "roof16_2", 2, "f16")]
VARIANTS = sorted({n for s in STEPS for n in s[:3]} | {s[2] + "p" for s in STEPS})
ROOF_LIMIT, SPEEDUP, GGML_FACTOR = 1.25, 1.7, 3.0


def run_shape(bench, shape, reps, min_time):
    """{variant: its fastest repetition} of one attention_bench process over `shape`, and the
    process's L2 bytes a core (from the JSON's context)."""
    d, w, kv = shape
    pattern = f"^decode/D:{d}/W:{w}/kv:{kv}/({'|'.join(VARIANTS)})/"
    runs = {}
    context = run_interleaved(bench, pattern, reps, min_time, lambda path: load_attention(path, runs))
    fastest_roofs(runs)
    l2 = l2_bytes(context)
    return {k[3]: v for k, v in runs.items()}, l2


def spread(values):
    """Median (min–max) of a list."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def verdict(step, floor, limit):
    if statistics.median(step) <= limit:
        return "met"
    return "out of reach" if floor and statistics.median(floor) > limit else "missed"


def roof_rows(shapes, rounds):
    """Rows of the × roof table: each step against its roof, with its floor's ratio."""
    lines = ["| D | W | kv | step | rows | threads | × roof | floor × roof | verdict |",
             "| ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | --- |"]
    for shape in shapes:
        for step, floor, roof, threads, rows in STEPS:
            got = [r for r in rounds[shape] if step in r and roof in r]
            if not got:
                continue
            ratio = [micros(r[step]) / micros(r[roof]) for r in got]
            low = [micros(r[floor]) / micros(r[roof]) for r in got if floor in r]
            lines.append(f"| {' | '.join(map(str, shape))} | {step} | {rows} | {threads} | "
                         f"{spread(ratio)} | {spread(low) if low else '–'} | "
                         f"{verdict(ratio, low, ROOF_LIMIT)} |")
    return "\n".join(lines)


def other_rows(shapes, rounds, l2):
    """The speed-up of 2 threads past the L2, and kv 2 against ggml's figures (with the exp
    floor's own factor: where even it is under the factor, so is any exact step)."""
    lines = ["| D | W | kv | target | median (range) | floor's | verdict |",
             "| ---: | ---: | ---: | --- | ---: | ---: | --- |"]
    for shape in shapes:
        name = " | ".join(map(str, shape))
        got = [r for r in rounds[shape] if "pair" in r and "pair2" in r]
        if got and got[0]["pair"]["kv_bytes"] > l2:
            up = [micros(r["pair"]) / micros(r["pair2"]) for r in got]
            roofs = [micros(r["roof"]) / micros(r["roof2"]) for r in got
                     if "roof" in r and "roof2" in r]
            ok = ("met" if statistics.median(up) >= SPEEDUP else
                  "out of reach" if roofs and ROOF_LIMIT * statistics.median(roofs) < SPEEDUP
                  else "missed")
            lines.append(f"| {name} | 2 threads ÷ 1 ≥ {SPEEDUP}× (window past the L2) | "
                         f"{spread(up)} | {spread(roofs) if roofs else '–'} | {ok} |")
        ggml = GGML_US.get(shape + ("f32",))
        if shape[2] != 2 or not ggml:
            continue
        for step, floor, threads in (("pair", "floor_exp", 1), ("pair2", "floor2_exp", 2)):
            figure = ggml[threads - 1]
            faster = [figure / micros(r[step]) for r in rounds[shape] if step in r]
            most = [figure / micros(r[floor]) for r in rounds[shape] if floor in r]
            if not faster:
                continue
            # The same test as verdict()'s, on speed-ups (higher is better): negated.
            ok = verdict([-x for x in faster], [-x for x in most], -GGML_FACTOR)
            lines.append(f"| {name} | {step} ≥ {GGML_FACTOR}× faster than ggml's figure | "
                         f"{spread(faster)} | {spread(most) if most else '–'} | {ok} |")
    return "\n".join(lines)


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("--bench", default="build/release/bench/attention_bench")
    a.add_argument("--rounds", type=int, default=5)
    a.add_argument("--reps", type=int, default=5)
    a.add_argument("--min-time", default="0.1")
    a.add_argument("--shapes", default=".", help="regex over 'D/W/kv', e.g. '^64/256/'")
    args = a.parse_args()
    shapes = [s for s in GRID if re.search(args.shapes, "/".join(map(str, s)))]
    rounds, l2 = {s: [] for s in shapes}, 0
    for k in range(args.rounds):
        for shape in shapes:
            runs, l2 = run_shape(args.bench, shape, args.reps, args.min_time)
            rounds[shape].append(runs)
        print(f"round {k + 1} of {args.rounds} done", file=sys.stderr)
    print(f"{args.rounds} rounds × {args.reps} interleaved repetitions a shape; each ratio from "
          "one process's fastest repetitions; median (min–max) over the rounds.\n")
    print(roof_rows(shapes, rounds))
    print()
    print(other_rows(shapes, rounds, l2))


if __name__ == "__main__":
    main()
