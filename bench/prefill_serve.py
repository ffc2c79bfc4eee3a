"""Prefill of a long prompt: gguf_run's single-sequence prefill of a P-token random prompt
(chunks of 512) against llama.cpp's (llama_speed, batches of 512, flash attention off and on),
and gguf_run --parallel 16's time to first token for that prompt arriving while 15 others (64-token
prompts) decode; the two 8-layer models of bench/serve.py, f32 K/V, 1 and 2 threads, each cell once
a round, rounds interleaved, medians. Run through scripts/bench-serve --prefill."""
import argparse
import itertools
import os
import random
import re
import statistics
import subprocess

from serve import MODELS, make_models


def run(args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def ringkv_prefill(bin_dir, model, prompt, threads):
    out = run([f"{bin_dir}/examples/gguf_run/gguf_run", "--model", model, "--random-prompt",
               str(prompt), "--generate", "1", "--chunk", "512", "--threads", str(threads)])
    return float(re.search(r"^prefill: \d+ tokens in [0-9.]+ s, ([0-9.]+) tok/s", out, re.M)[1])


def llama_prefill(bin_dir, model, prompt, threads, flash):
    out = run([f"{bin_dir}/tests/gguf/llama_speed", model, str(prompt), "1", str(threads), "1", "0",
               "1" if flash else "0"])
    return float(re.search(r"prefill \d+ tokens ([0-9.]+) tok/s", out)[1])


def first_token_ms(bin_dir, model, prompts_file, threads):
    out = run([f"{bin_dir}/examples/gguf_run/gguf_run", "--model", model, "--prompts", prompts_file,
               "--generate", "64", "--parallel", "16", "--chunk", "512", "--threads", str(threads)])
    return float(re.search(r"^first token: sequence \d+ \(\d+ prompt tokens\) ([0-9.]+) ms", out,
                           re.M)[1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/release")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt", type=int, default=4096)
    a = ap.parse_args()
    paths = make_models(a.bin)
    # 15 prompts of 64 tokens, then the long one: it joins at step 15, the others decoding.
    rng = random.Random(7)
    prompts_file = "build/bench-serve/prompts.txt"
    with open(prompts_file, "w") as f:
        for i in range(16):
            n = a.prompt if i == 15 else 64
            f.write(",".join(str(rng.randrange(8192)) for _ in range(n)) + "\n")
    ts = [int(x) for x in a.threads.split(",")]
    cells = list(itertools.product(paths, ts))
    got = {}
    for _ in range(a.rounds):
        for name, t in cells:
            m = paths[name]
            got.setdefault((name, t, "ringkv"), []).append(ringkv_prefill(a.bin, m, a.prompt, t))
            got.setdefault((name, t, "off"), []).append(llama_prefill(a.bin, m, a.prompt, t, False))
            got.setdefault((name, t, "on"), []).append(llama_prefill(a.bin, m, a.prompt, t, True))
            got.setdefault((name, t, "ttft"), []).append(first_token_ms(a.bin, m, prompts_file, t))
    print(f"| model / threads | ringkv prefill tok/s | llama.cpp FA off | llama.cpp FA on "
          f"| ringkv ÷ best llama.cpp | first token of {a.prompt} among 15 decoding, ms |")
    print("| --- | --: | --: | --: | --: | --: |")
    for name, t in cells:
        r, off, on, ttft = (statistics.median(got[(name, t, k)])
                            for k in ("ringkv", "off", "on", "ttft"))
        print(f"| {name} / {t} | {r:,.0f} | {off:,.0f} | {on:,.0f} | {r / max(off, on):.2f} "
              f"| {ttft:,.0f} |")


if __name__ == "__main__":
    main()
