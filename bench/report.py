#!/usr/bin/env python3
"""The decode benchmark report (scripts/bench): reads attention_bench's JSON and, optionally,
compressed_attention_bench's (its 4-bit TurboQuant variant), and writes the markdown tables of
bench/README.md to stdout and, with --plot DIR, gnuplot data + an SVG of µs per decode step and
GB/s against W.

    report.py ATTENTION_JSON [--compressed COMPRESSED_JSON] [--plot DIR]

attention_bench's variants report `kv_bytes` (the unique K+V bytes one step must read, as
stored) and `x_roof`; the tables compute × roof from the fastest repetitions of the variant and of
its streaming read (roof, roof2, roof16, roof16_2: each the faster of its two reads, K then V or
K and V in turn, the `p` variants) in the same run instead, so that both numbers of a cell come
from the same measurements."""
import json
import os
import re
import subprocess
import sys
import tempfile

# ggml's CPU flash attention on this machine type, hot cache, 8 query heads (issues 4 and 8),
# µs per step: (D, W, kv_heads, type) -> (1 thread, 2 threads).
GGML_US = {
    (128, 4096, 8, "f32"): (1172.5, 669.6),
    (128, 4096, 2, "f32"): (1140.9, 573.1),
    (128, 4096, 8, "f16"): (717.0, 558.7),
    (128, 256, 8, "f32"): (51.6, 30.4),
    (64, 4096, 8, "f16"): (705.0, 408.1),
    (128, 32768, 8, "f32"): (22069.7, 12865.1),
}

# (variant name in the JSON, column label, threads, ggml type to compare with)
VARIANTS = [
    ("floor", "floor (roof read + multiply-adds)", 1, None),
    ("floor_exp", "exp floor (floor + an exp a score)", 1, None),
    ("pair", "ringkv f32", 1, "f32"),
    ("gathered", "gather + attend f32", 1, None),
    ("floor_f16", "floor f16 (roof16 read + promotion + multiply-adds)", 1, None),
    ("pair_f16", "ringkv f16", 1, "f16"),
    ("pair_bf16", "ringkv bf16", 1, None),
    ("tq4", "ringkv 4-bit TurboQuant", 1, None),
    ("scalar", "scalar two-pass f32", 1, None),
    ("ggml", "ggml's loop f32 (same run)", 1, None),
    ("floor2", "floor (roof read + multiply-adds)", 2, None),
    ("floor2_exp", "exp floor (floor + an exp a score)", 2, None),
    ("pair2", "ringkv f32", 2, "f32"),
    ("floor2_f16", "floor f16 (roof16 read + promotion + multiply-adds)", 2, None),
    ("pair2_f16", "ringkv f16", 2, "f16"),
    ("ggml2", "ggml's loop f32 (same run)", 2, None),
]
# ringkv's f32 step and ggml's loop re-written (bench/ggml_style.h), by threads: the last column.
PORT = {1: ("pair", "ggml"), 2: ("pair2", "ggml2")}
ROOF = {1: "roof", 2: "roof2"}


def load(path, pattern, key_of, runs):
    """Adds the runs of `path` whose names match `pattern` to runs[key_of(match)]; returns the
    JSON's context. With repetitions the fastest ("min" aggregate) is kept."""
    with open(path) as f:
        doc = json.load(f)
    for b in doc["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "min":
            continue
        m = re.match(pattern, b["name"])
        if not m or key_of(m) is None:
            continue
        key = key_of(m)
        if b.get("run_type") == "aggregate" or key not in runs:
            runs[key] = b
    return doc.get("context", {})


def run_interleaved(bench, pattern, reps, min_time, load_into):
    """Runs `bench` once over the benchmarks matching `pattern`, `reps` interleaved repetitions
    each (aggregates only), and returns load_into(path of its JSON output) (exits on failure)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        done = subprocess.run([bench, f"--benchmark_filter={pattern}",
                               f"--benchmark_repetitions={reps}",
                               "--benchmark_enable_random_interleaving=true",
                               "--benchmark_report_aggregates_only=true",
                               f"--benchmark_min_time={min_time}", f"--benchmark_out={out.name}",
                               "--benchmark_out_format=json"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            sys.exit(f"{bench} failed ({done.returncode}) on {pattern}:\n{done.stderr}")
        return load_into(out.name)


def l2_bytes(context):
    """The L2 bytes a core in a Google Benchmark JSON's context (0 when it says nothing)."""
    return max((c["size"] for c in context.get("caches", []) if c.get("level") == 2), default=0)


def load_attention(path, runs):
    return load(path, r"decode/D:(\d+)/W:(\d+)/kv:(\d+)/(\w+)",
                lambda m: (int(m[1]), int(m[2]), int(m[3]), m[4]), runs)


def load_compressed(path, runs):
    """compressed_attention_bench's tq4 (TurboQuant 4-bit keys and values, 1 thread) as "tq4",
    its bytes from the store's (kv_bytes); no roof of its own (x_roof left out)."""
    load(path, r"compressed/D:(\d+)/W:(\d+)/kv:(\d+)/tq4/",
         lambda m: (int(m[1]), int(m[2]), int(m[3]), "tq4"), runs)


def fastest_roofs(runs):
    """Each roof ← the faster of its two reads (K then V; K and V in turn, name + "p")."""
    for key in [k for k in runs if k[3] in ("roof", "roof2", "roof16", "roof16_2")]:
        paired = runs.pop(key[:3] + (key[3] + "p",), None)
        if paired and micros(paired) < micros(runs[key]):
            runs[key] = paired


def micros(b):
    return b["real_time"] * {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[b["time_unit"]]


def roof_of(name, threads):
    """The streaming read a variant is measured against: the same bytes, as many threads (none
    for the 4-bit variant, whose bytes no roof here reads)."""
    if name == "tq4":
        return None
    halves = name.endswith("_f16") or name.endswith("_bf16")
    return {(False, 1): "roof", (False, 2): "roof2", (True, 1): "roof16", (True, 2): "roof16_2"}[
        (halves, threads)]


def cell(b, roof=None, ggml=None):
    """µs (× the roof's fastest repetition in the same run, GB/s) [speed-up over ggml]."""
    if not b:
        return "–"
    t = micros(b)
    ratio = f"{t / micros(roof):.2f}×, " if roof else ""
    text = f"{t:,.1f} ({ratio}{b['kv_bytes'] / t / 1e3:.0f} GB/s)"
    if ggml:
        text += f" **{ggml / t:.1f}× ggml**"
    return text


def table(runs, threads):
    shapes = sorted({k[:3] for k in runs}, key=lambda s: (s[0], s[1], -s[2]))
    cols = [v for v in VARIANTS if v[2] == threads and any(k[3] == v[0] for k in runs)]
    lines = ["| D | W | kv | f32 K+V MB | roof µs (GB/s) | " +
             " | ".join(f"{label} µs (× roof, GB/s)" for _, label, _, _ in cols) +
             " | ggml f32 / f16 µs | ringkv f32 over ggml's loop |",
             "| ---: | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in cols) + " | ---: | ---: |"]
    for d, w, kv in shapes:
        roof = runs.get((d, w, kv, ROOF[threads]))
        if not roof:
            continue
        ggml = {t: GGML_US.get((d, w, kv, t)) for t in ("f32", "f16")}
        cells = []
        for name, _, thr, gtype in cols:
            g = ggml.get(gtype) if gtype else None
            roof_name = roof_of(name, thr)
            cells.append(cell(runs.get((d, w, kv, name)), runs.get((d, w, kv, roof_name)) if roof_name else None,
                              g[thr - 1] if g else None))
        ggml_text = " / ".join(f"{g[threads - 1]:,.0f}" if g else "–" for g in ggml.values())
        ours, port = (runs.get((d, w, kv, name)) for name in PORT[threads])
        port_text = f"{micros(port) / micros(ours):.2f}×" if ours and port else "–"
        lines.append(f"| {d} | {w} | {kv} | {roof['kv_bytes'] / 1e6:.1f} | "
                     f"{micros(roof):,.1f} ({roof['kv_bytes'] / micros(roof) / 1e3:.0f}) | "
                     + " | ".join(cells) + f" | {ggml_text} | {port_text} |")
    return "\n".join(lines)


def plot(runs, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    series = [("roof", "roof f32 (streaming read), 1 thread"), ("roof2", "roof f32, 2 threads")] + [(v[0], f"{v[1]}, {v[2]} thread{'s' if v[2] > 1 else ''}")
                                                   for v in VARIANTS]
    series = [s for s in series if any(k[3] == s[0] for k in runs)]
    panels = sorted({(k[0], k[2]) for k in runs}, key=lambda p: (p[0], -p[1]))
    data = os.path.join(out_dir, "decode.dat")
    with open(data, "w") as f:
        for d, kv in panels:
            for name, _ in series:
                f.write(f"# D={d} kv={kv} {name}\n")
                for w in sorted({k[1] for k in runs if k[0] == d and k[2] == kv}):
                    b = runs.get((d, w, kv, name))
                    if b:
                        f.write(f"{w} {micros(b)} {b['kv_bytes'] / micros(b) / 1e3}\n")
                f.write("\n\n")
    script = [f'set terminal svg size 1400,{560 * 2} dynamic font "sans,11"',
              f'set output "{os.path.join(out_dir, "decode.svg")}"',
              f"set multiplot layout 2,{len(panels)} title 'one decode step, 8 query heads (ringkv bench/attention\\_bench)'",
              "set logscale x 2", "set key top left font ',9'", "set grid"]
    for metric, col, ylabel in (("time", 2, "µs per step (log)"), ("bandwidth", 3, "unique K+V GB/s")):
        for i, (d, kv) in enumerate(panels):
            script.append(f"set title 'D={d}, kv\\_heads={kv}: {metric}'")
            script.append("set logscale y" if col == 2 else "unset logscale y")
            script.append(f"set xlabel 'W (positions)'; set ylabel '{ylabel}'")
            plots = []
            for j, (name, label) in enumerate(series):
                index = i * len(series) + j
                title = label.replace("'", "''")  # a quote doubled inside gnuplot's '…'
                plots.append(f"'{data}' index {index} using 1:{col} with linespoints title '{title}'")
            script.append("plot " + ", \\\n  ".join(plots))
    script.append("unset multiplot")
    subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)
    return os.path.join(out_dir, "decode.svg")


def main(argv):
    path = argv[1] if len(argv) > 1 and not argv[1].startswith("--") else "build/bench/attention.json"
    runs = {}
    context = load_attention(path, runs)
    fastest_roofs(runs)
    if "--compressed" in argv:
        load_compressed(argv[argv.index("--compressed") + 1], runs)
    print(f"{context.get('num_cpus', '?')} CPUs at {context.get('mhz_per_cpu', '?')} MHz, load average "
          f"{[round(x, 2) for x in context.get('load_avg', [])]}; fastest of the repetitions. Cells: µs per "
          "step (× the fastest streaming read of the variant's own bytes with as many threads in the same run; "
          "unique bytes per second); bold: speed-up over ggml's figure for the same shape and threads; "
          "last column: ggml's loop re-written (bench/ggml_style.h) ÷ ringkv f32, same run. "
          "roof: the faster of two streaming reads of the f32 bytes (K then V, or K and V in turn). "
          "floor: the paired read with one multiply-add per query head of the group on every vector "
          "read (the least arithmetic an exact step does on those bytes; no lane sums, exp or rescale): "
          "where it is above 1.25× the roof, so is every kernel. exp floor: the floor with the vector "
          "exp every score takes (Highway's Exp over a vector of scores at a time).\n")
    print("### 1 thread\n")
    print(table(runs, 1))
    if any(k[3].startswith("pair2") for k in runs):
        print("\n### 2 threads\n")
        print(table(runs, 2))
    if "--plot" in argv:
        print(f"\n![decode step vs W]({os.path.relpath(plot(runs, argv[argv.index('--plot') + 1]), 'bench')})")


if __name__ == "__main__":
    main(sys.argv)
