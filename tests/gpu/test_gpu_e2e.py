#!/usr/bin/env python3
"""Greedy tokens of a GPU backend equal cpu.so's on the real model.

usage: test_gpu_e2e.py BACKEND LOOM_EXE [N_TOKENS]

Runs `loom run --temp 0` with cpu.so and with BACKEND.so on the same
prompts and compares the generated token ids (--dump-tokens): 32 of them,
20 on the emulators (about 2-4 s a decode step there; 20 still replay the
step graph at positions 18..34 of the 16-token prompt, across a KV block
boundary at 32, and the later steps repeat the same kernels on the same
shapes). The prompts are long enough (> 8 tokens) that prefill takes the
tiled attention kernel and, at 16+ rows, the GEMM path; decode takes the
GEMV and split-K kernels.

Then k-quants: a tiny random llama (tools/mkgguf.py, 2 layers, 256 wide,
f16) requantized by `loom quantize` to Q2_K, Q3_K_M, Q4_K_M and Q5_K_M
(q2_K .. q6_K between them) and to Q4_1, Q5_0 and Q5_1, 16 greedy tokens
each (10 on the emulators) against cpu.so, the prompt long enough for the prefill GEMM path;
the memory plan must say that no tensor was converted to f32 at load. In
fast mode (LOOM_GPU_EXACT=0: 8-bit activations, integer dots in the GEMV
for every quantized format) each decodes the same tokens with step
graphs replayed as run directly. A second or so per run, even emulated. The same tiny model in Q4_0 and Q8_0 runs
with its weights repacked by the backend (weight_pack) and without
(LOOM_GPU_PACK=0): the same tokens in exact and fast mode, exact equal
to cpu.so's.

Exit 77 when the backend was not built, has no
device (cuda: /dev/nvidia0, rocm: /dev/kfd; the emulators always have one)
or the model is missing.
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

PROMPTS = [
    "The three primary colors are red, yellow and blue. Mixing two of them gives",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]


# every k-quant between the first three (q2_K .. q6_K), Q5_K_M's q5_K
# with q6_K, and the 32-value formats with a min or a fifth bit
KQUANT_MIXES = ["Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q4_1", "Q5_0", "Q5_1"]
# each in the fast GEMV's integer dots too (sched_gpuemu and
# sched_swa_gpuemu decode q4_0 and q8_0 models in fast mode, every step
# in a region); the sampling rules on Q4_K_M alone
FAST_MIXES = KQUANT_MIXES
SAMPLED_MIX = "Q4_K_M"
HOST_GREEDY_MIXES = ("Q4_K_M", "Q5_1")
KQUANT_TOKENS = 16
# on the emulators (a run is mostly its emulated decode steps): 10 still
# replay the step graph 6 times and more
KQUANT_TOKENS_EMULATED = 10
MKGGUF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                      "mkgguf.py")


def run(loom, backend, model, prompt, n, out, log=None, sampling=("--temp", "0"), **env_extra):
    """Token ids, the speed line and the backend's step-graph counts (or
    None); the run's stderr appended to log when given."""
    # the backend's info lines on stderr; cpu.so and the GPU backend in
    # exact mode (f32 activations), the path GPU backends are held to,
    # unless env_extra says otherwise
    env = dict(os.environ, LOOM_DEBUG="1", LOOM_CPU_EXACT="1", LOOM_GPU_EXACT="1")
    env.update(env_extra)
    p = subprocess.run([loom, "run", f"--backend={backend}", "--model", model, "-p", prompt,
                        "-n", str(n), *sampling, "--no-progress", "--dump-tokens", out],
                       capture_output=True, text=True, errors="replace", timeout=900, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"loom run --backend={backend} failed (rc {p.returncode}):\n"
                           f"{p.stdout}{p.stderr}")
    if log is not None:
        log.append(p.stderr)
    graphs = re.search(r"step graphs: (\d+) captured, (\d+) replays", p.stderr)
    waits = re.search(r"host waits: (\d+) in (\d+) step regions", p.stderr)
    if waits and log is not None:
        log.append(tuple(int(w) for w in waits.groups()))
    speed = [l for l in p.stderr.splitlines() if "generated" in l][-1:]
    with open(out) as f:
        return ([int(t) for t in f.read().split()], speed,
                tuple(int(g) for g in graphs.groups()) if graphs else None)


def kquant_models(loom, tmp, mixes=KQUANT_MIXES):
    """The tiny model in each of mixes: [(mix, path)]."""
    src = os.path.join(tmp, "tiny16.gguf")
    if not os.path.exists(src):
        subprocess.run([sys.executable, MKGGUF, src, "--layers", "2", "--embd", "256", "--ff",
                        "512", "--heads", "4", "--kv-heads", "2", "--vocab", "1024", "--type",
                        "f16", "--seed", "5", "-q"], check=True, capture_output=True, timeout=120)
    models = []
    for mix in mixes:
        dst = os.path.join(tmp, f"tiny_{mix}.gguf")
        if os.path.exists(dst):  # made already for another check
            models.append((mix, dst))
            continue
        subprocess.run([loom, "quantize", src, dst, mix], check=True, capture_output=True,
                       timeout=120)
        models.append((mix, dst))
    return models


def check_kquants(loom, stem, tmp):
    """Greedy tokens of the tiny k-quant models equal cpu.so's, nothing
    converted to f32 at load. Returns the number of failures."""
    out, failed = os.path.join(tmp, "ktokens"), 0
    for mix, model in kquant_models(loom, tmp):
        log = []
        want, _, _ = run(loom, "cpu.so", model, PROMPTS[0], KQUANT_TOKENS, out)
        got, _, _ = run(loom, f"{stem}.so", model, PROMPTS[0], KQUANT_TOKENS, out, log)
        native = "; 0 tensors converted to f32 at load)" in log[0]
        same = got == want and len(got) == KQUANT_TOKENS
        print(f"{'ok  ' if same and native else 'FAIL'} {stem}.so {mix}: {len(got)} tokens "
              f"{'equal' if same else 'differ from'} cpu.so's, "
              f"{'nothing' if native else 'something'} converted to f32 at load")
        if not same:
            print(f"     cpu: {want}\n     {stem}: {got}")
        if not native:
            print(log[0])
        failed += not (same and native)
        if mix in FAST_MIXES:
            failed += check_fast(loom, stem, mix, model, out, got)
        # gpuemu64's sampling kernels are held to the host sampler by
        # sched_sample_gpuemu64 (tokens and logprobs bit for bit)
        if mix == SAMPLED_MIX and stem != "gpuemu64":
            failed += check_sampled(loom, stem, model, out)
    return failed


# Q4_K_M: its q6_K tensors (the rest q4_K, whose blocks are aligned)
PACKED_MIXES = ["Q4_0", "Q8_0", "Q4_K_M"]
PACKED_LINE = re.compile(r"weights packed \(q4_0/q8_0/q6_K, 16-byte aligned quants\): (\d+)")


def tied_models(tmp):
    """The tiny llama with a tied token table, in q4_0 and q8_0: [(name, path)]."""
    models = []
    for qtype in ("q4_0", "q8_0"):
        path = os.path.join(tmp, f"tied_{qtype}.gguf")
        subprocess.run([sys.executable, MKGGUF, path, "--layers", "2", "--embd", "256", "--ff",
                        "512", "--heads", "4", "--kv-heads", "2", "--vocab", "1024", "--type",
                        qtype, "--tied", "--seed", "9", "-q"], check=True, capture_output=True,
                       timeout=120)
        models.append((f"tied {qtype}", path))
    return models


def check_packed(loom, stem, tmp):
    """The weight_pack slot (gpu_pack.c): the tiny model in Q4_0, Q8_0 and
    Q4_K_M, and with a tied q4_0 or q8_0 token table (packed too: embed
    and the head read the backend's layout, ABI 1.5), loads with its
    q4_0/q8_0/q6_K weights repacked (the backend's log counts
    them; LOOM_GPU_PACK=0 packs none), greedy tokens in exact mode equal
    cpu.so's, and in both modes equal those of LOOM_GPU_PACK=0 (the same
    kernels' arithmetic on the GGUF layout). Returns the number of
    failures."""
    out, failed = os.path.join(tmp, "ptokens"), 0
    for mix, model in kquant_models(loom, tmp, PACKED_MIXES) + tied_models(tmp):
        want, _, _ = run(loom, "cpu.so", model, PROMPTS[0], KQUANT_TOKENS, out)
        for exact in ("1", "0"):
            logs, toks = {}, {}
            for pack in ("1", "0"):
                log = []
                toks[pack], _, _ = run(loom, f"{stem}.so", model, PROMPTS[0], KQUANT_TOKENS, out,
                                       log, LOOM_GPU_EXACT=exact, LOOM_GPU_PACK=pack)
                found = PACKED_LINE.search(log[0])
                logs[pack] = int(found.group(1)) if found else 0
            ok = (toks["1"] == toks["0"] and len(toks["1"]) == KQUANT_TOKENS and
                  logs["1"] > 0 and logs["0"] == 0 and (exact == "0" or toks["1"] == want) and
                  # a tied table: packed too (ABI 1.5), read by embed and the head
                  (not mix.startswith("tied") or logs["1"] == 2 * 7 + 1))
            print(f"{'ok  ' if ok else 'FAIL'} {stem}.so {mix} {'exact' if exact == '1' else 'fast'}"
                  f" mode: {logs['1']} weights packed, tokens "
                  f"{'equal' if toks['1'] == toks['0'] else 'differ from'} LOOM_GPU_PACK=0's"
                  f"{'' if exact == '0' else ' and ' + ('equal' if toks['1'] == want else 'differ from') + ' cpu.so' + chr(39) + 's'}")
            if not ok:
                print(f"     cpu: {want}\n     packed: {toks['1']}\n     GGUF layout: {toks['0']}")
            failed += not ok
    return failed


def check_fast(loom, stem, mix, model, out, exact):
    """Fast mode (8-bit activations in the GEMV): captured and replayed
    step graphs give the tokens of direct runs (LOOM_GPU_GRAPHS=0),
    greedy picked on the device those picked on the host, and on the
    emulators the tokens of cpu.so's fast mode; the
    agreement with exact mode's tokens is printed, not judged (a random
    model's greedy path may turn on a near tie)."""
    n = KQUANT_TOKENS
    fast, _, graphs = run(loom, f"{stem}.so", model, PROMPTS[0], n, out, LOOM_GPU_EXACT="0")
    direct, _, _ = run(loom, f"{stem}.so", model, PROMPTS[0], n, out, LOOM_GPU_EXACT="0",
                       LOOM_GPU_GRAPHS="0")
    # greedy on the host against the device: the argmax kernel does not
    # depend on the weights' format, so the emulators take two mixes
    host = fast
    if not stem.startswith("gpuemu") or mix in HOST_GREEDY_MIXES:
        host, _, _ = run(loom, f"{stem}.so", model, PROMPTS[0], n, out, LOOM_GPU_EXACT="0",
                         LOOM_DEVICE_GREEDY="0")
    same = fast == direct and len(fast) == n and graphs and graphs[1] >= n - 4
    if host != fast:
        print(f"FAIL {stem}.so {mix}: greedy on the host (LOOM_DEVICE_GREEDY=0) picks "
              f"{host}, on the device {fast}")
        same = False
    # cpu.so's fast mode quantizes the activations to the same blocks and
    # sums each block's products in integers too: on the emulators (no
    # contraction of the float steps) the same tokens, judged
    cpu, _, _ = run(loom, "cpu.so", model, PROMPTS[0], n, out, LOOM_CPU_EXACT="0")
    if stem.startswith("gpuemu") and cpu != fast:
        print(f"FAIL {stem}.so {mix} fast mode: cpu.so's fast mode picks {cpu}, {stem} {fast}")
        same = False
    agree = next((i for i, (a, b) in enumerate(zip(fast, exact)) if a != b), len(fast))
    print(f"{'ok  ' if same else 'FAIL'} {stem}.so {mix} fast mode: graphs {graphs}, tokens "
          f"{'equal to' if fast == direct else 'differ from'} direct runs' and "
          f"{'equal to' if fast == cpu else 'differ from'} cpu.so fast mode's; the first "
          f"{agree} of {len(fast)} equal exact mode's")
    return 0 if same else 1


# Sampling rules: (flags, whether the device samples). Top-k and penalties
# since ABI 1.8; without top-k (top_k 0 or >= the vocabulary) since 1.9
# (LOOM_OP_SAMPLE_FULL), and left to the host with LOOM_GPU_SAMPLE_19=0.
SAMPLINGS = [
    (("--temp", "0.8", "--top-k", "40", "--top-p", "0.95", "--min-p", "0.05"), True),
    (("--temp", "1.3", "--top-k", "200", "--top-p", "1", "--min-p", "0",
      "--repeat-penalty", "1.3", "--presence-penalty", "0.5", "--frequency-penalty", "0.3",
      "--repeat-last-n", "16"), True),
    (("--temp", "0", "--repeat-penalty", "1.5"), True),
    (("--temp", "2", "--top-k", "5", "--top-p", "0.5"), True),
    (("--temp", "0.9", "--top-k", "0", "--top-p", "0.9"), True),
    (("--temp", "1.1", "--top-k", "0", "--top-p", "1", "--min-p", "0.02",
      "--repeat-penalty", "1.2", "--repeat-last-n", "16"), True),
    (("--temp", "0.9", "--top-k", "0", "--top-p", "0.9", "LOOM_GPU_SAMPLE_19=0"), False),
]


def check_sampled(loom, stem, model, out):
    """Sampling on the device (ABI 1.8 sample slot) draws the host
    sampler's tokens for the same seed: each rule of SAMPLINGS and several
    seeds (one a rule on the emulators), with the slot and with LOOM_DEVICE_SAMPLE=0 (the host samples
    from downloaded logits); rules without top-k too (ABI 1.9), and on the
    host with LOOM_GPU_SAMPLE_19=0 (the backend answers as a 1.8 one). One
    host wait a step either way. Returns the number of failures."""
    failed = 0
    seeds = ("1", "7", "12345")
    for i, (flags, on_device) in enumerate(SAMPLINGS):
        env = dict(f.split("=", 1) for f in flags if "=" in f)
        # every seed a rule on a device; on the emulators (seconds a run)
        # and for the fallback, one, the rules taking the seeds in turn
        one = env or stem.startswith("gpuemu")
        for seed in (seeds[i % len(seeds)],) if one else seeds:
            log = []
            args = (*(f for f in flags if "=" not in f), "--seed", seed)
            dev, _, _ = run(loom, f"{stem}.so", model, PROMPTS[0], KQUANT_TOKENS, out, log,
                            sampling=args, LOOM_GPU_EXACT="0", **env)
            host, _, _ = run(loom, f"{stem}.so", model, PROMPTS[0], KQUANT_TOKENS, out,
                             sampling=args, LOOM_GPU_EXACT="0", LOOM_DEVICE_SAMPLE="0")
            rows = re.search(r"rows sampled on the device: (\d+)", log[0])
            rows = int(rows.group(1)) if rows else 0
            waits = next((x for x in log if isinstance(x, tuple)), None)
            # an end-of-text token may stop a run early (both runs alike)
            ok = (dev == host and len(dev) >= 1 and
                  (rows >= len(dev) - 1 if on_device else rows == 0) and
                  waits is not None and waits[0] <= waits[1] + 1)
            shown = " ".join((*args, *(f"{k}={v}" for k, v in env.items())))
            print(f"{'ok  ' if ok else 'FAIL'} {stem}.so {shown}: {len(dev)} tokens "
                  f"{'equal' if dev == host else 'differ from'} the host sampler's, "
                  f"{rows} rows sampled on the device, host waits {waits}")
            if dev != host:
                print(f"     host: {host}\n     {stem}: {dev}")
            failed += not ok
    return failed


def check_waits(stem, log):
    """One host wait a step (the download of the logits or of the greedy
    ids): step inputs and attention work items go up without waiting and
    the tables are checked from the host's copy. Returns 1 on failure."""
    waits = next((x for x in log if isinstance(x, tuple)), None)
    ok = waits is not None and waits[1] > 0 and waits[0] <= waits[1] + 1
    print(f"{'ok  ' if ok else 'FAIL'} {stem}.so host waits (waits, step regions): {waits}, "
          f"want at most one a step")
    return 0 if ok else 1


def main():
    global KQUANT_TOKENS
    stem, loom = sys.argv[1], sys.argv[2]
    emulated = stem.startswith("gpuemu")
    if emulated:
        KQUANT_TOKENS = KQUANT_TOKENS_EMULATED
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 20 if emulated else 32
    root = os.environ.get("LOOM_BUILD_ROOT", "")
    if not glob.glob(os.path.join(root, "backends", "*", f"{stem}.so")):
        print(f"{stem}.so was not built: skipping")
        return 77
    if not emulated and not os.path.exists(
            "/dev/nvidia0" if stem == "cuda" else "/dev/kfd"):
        print(f"{stem}.so: no device on this machine: skipping")
        return 77
    model = os.environ.get("LOOM_MODEL", "")
    if not os.path.isfile(model):
        print(f"model {model!r} missing: skipping")
        return 77
    prompts = PROMPTS[:1] if emulated else PROMPTS  # emulation is slow
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "tokens")
        for prompt in prompts:
            want, _, _ = run(loom, "cpu.so", model, prompt, n, out)
            log = []
            got, stats, graphs = run(loom, f"{stem}.so", model, prompt, n, out, log)
            failed += check_waits(stem, log)
            same = got == want and len(got) >= min(n, 32)
            print(f"{'ok  ' if same else 'FAIL'} {stem}.so {len(got)} tokens "
                  f"{'equal' if same else 'differ from'} cpu.so's for {prompt[:30]!r} {stats}")
            if not same:
                first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                             min(len(got), len(want)))
                print(f"     first difference at token {first}:\n     cpu: {want}\n     {stem}: {got}")
                failed += 1
            # decode steps repeat their calls, so all but the first few replay
            # a captured graph (prefill, first decode step, the capture)
            if not graphs or graphs[1] < n - 4:
                print(f"FAIL {stem}.so: step graphs (captured, replays) = {graphs}, "
                      f"want at least {n - 4} replays over {n} decode steps")
                failed += 1
            else:
                print(f"ok   {stem}.so step graphs: {graphs[0]} captured, {graphs[1]} replays")
        failed += check_kquants(loom, stem, tmp)
        failed += check_packed(loom, stem, tmp)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
