"""Aggregate decode tokens per second of N sequences served together: gguf_run --parallel N
against llama.cpp decoding the same N as one multi-sequence batch a step (a K/V stream a sequence,
and one unified buffer), on two 8-layer models (granite_swa and gemma3: n_embd 512, 8/2 heads of
64, ff 1536, window 512, two global layers, vocab 8192), f32 K/V, 1 and 2 threads. Each cell runs
once a round, the rounds interleave every cell, and the table holds the medians. Run through
scripts/bench-serve."""
import argparse
import itertools
import os
import re
import statistics
import subprocess

MODELS = {
    "granite_swa": ["--arch", "granite_swa", "--sliding", "1,1,1,0,1,1,1,0"],
    "gemma3": ["--arch", "gemma3", "--period", "4"],
}
SHAPE = ["--layers", "8", "--embd", "512", "--heads", "8", "--kv-heads", "2", "--head-dim", "64",
         "--ff", "1536", "--window", "512", "--vocab", "8192"]


def make_models(bin_dir):
    """Writes the two models under build/bench-serve/; returns their paths by name."""
    os.makedirs("build/bench-serve", exist_ok=True)
    paths = {}
    for name, args in MODELS.items():
        paths[name] = f"build/bench-serve/{name}.gguf"
        subprocess.run([f"{bin_dir}/examples/gguf_run/gguf_make", *args, *SHAPE, "--out",
                        paths[name]], check=True, capture_output=True)
    return paths


def ringkv(bin_dir, model, n, threads, prompt, generate):
    out = subprocess.run([f"{bin_dir}/examples/gguf_run/gguf_run", "--model", model,
                          "--random-prompt", str(prompt), "--generate", str(generate),
                          "--parallel", str(n), "--chunk", str(prompt), "--threads", str(threads)],
                         check=True, capture_output=True, text=True).stdout
    if n == 1:  # the one-sequence runner: its decode line
        m = re.search(r"^decode: \d+ tokens in [0-9.]+ s, ([0-9.]+) tok/s", out, re.M)
    else:
        m = re.search(r"^decode: \d+ tokens in steps where \d+ sequences decode, ([0-9.]+) tok/s",
                      out, re.M)
    return float(m.group(1))


def llama(bin_dir, model, n, threads, prompt, generate, unified):
    out = subprocess.run([f"{bin_dir}/tests/gguf/llama_speed", model, str(prompt), str(generate),
                          str(threads), str(n), "1" if unified else "0"],
                         check=True, capture_output=True, text=True).stdout
    return float(re.search(r"decode \d+ tokens ([0-9.]+) tok/s", out).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/release")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sequences", default="1,2,4,8,16")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--generate", type=int, default=64)
    a = ap.parse_args()
    paths = make_models(a.bin)
    ns = [int(x) for x in a.sequences.split(",")]
    ts = [int(x) for x in a.threads.split(",")]
    cells = list(itertools.product(MODELS, ts, ns))
    got = {}
    for _ in range(a.rounds):
        for name, t, n in cells:
            m = paths[name]
            got.setdefault((name, t, n, "ringkv"), []).append(
                ringkv(a.bin, m, n, t, a.prompt, a.generate))
            got.setdefault((name, t, n, "streams"), []).append(
                llama(a.bin, m, n, t, a.prompt, a.generate, False))
            got.setdefault((name, t, n, "unified"), []).append(
                llama(a.bin, m, n, t, a.prompt, a.generate, True))
    print("| model / threads | N | ringkv tok/s | llama.cpp streams | llama.cpp unified "
          "| ringkv ÷ best llama.cpp | ringkv ÷ its N = 1 |")
    print("| --- | --: | --: | --: | --: | --: | --: |")
    for name, t in itertools.product(MODELS, ts):
        one = statistics.median(got[(name, t, ns[0], "ringkv")])
        for n in ns:
            r = statistics.median(got[(name, t, n, "ringkv")])
            s = statistics.median(got[(name, t, n, "streams")])
            u = statistics.median(got[(name, t, n, "unified")])
            print(f"| {name} / {t} | {n} | {r:,.0f} | {s:,.0f} | {u:,.0f} | {r / max(s, u):.2f} "
                  f"| {r / one:.2f} |")


if __name__ == "__main__":
    main()
