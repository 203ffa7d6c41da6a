#!/usr/bin/env python3
"""gpt-oss: loom against the NumPy reference, and cpu.so against ref.so.

Usage: test_gptoss.py LOOM_BINARY MKGGUF_PY [--fallback BACKEND]
                      [--gpu BACKEND ...] [OLD_ABI_BACKEND ...]

tools/mkgguf.py --arch gpt-oss writes a small random gpt-oss (2 layers,
4 query / 2 KV heads, 4 experts of which 2 are routed, window 4 on the
even layers, YaRN factor 4, every bias and the attention sinks; the
expert gate/up matrices with gain 6 so that the SwiGLU's clamp at 7 is
reached), in f32 and with every matrix in mxfp4 (the experts' format of
the released models). For each:
  - ref.so and cpu.so (exact mode): the logits of the last prompt position
    within TOL of tests/e2e/ref_llama.py (float64; max|loom - ref| /
    max|ref|) and the same top-1; the greedy continuation equal to the
    reference's up to a near tie (test_synth.py's rule);
  - cpu.so --exact gives ref.so's greedy tokens exactly;
  - each gpt-oss feature matters: the reference without the sinks, the
    clamp, YaRN, the sliding window or the router bias, or with llama.cpp's
    other gating (softmax over all experts, then the top k, not
    renormalised), moves the logits by more than 10 * TOL;
  - cpu.so's fast mode within FAST_TOL of the reference and batch
    invariant (the prompt whole and in 3-token chunks give the same bits);
  - with mpirun, on the mxfp4 file, `--tp 2` equals the single process
    (test_moe.check_tp): the experts' gate/up biases split with their
    columns, the down bias added by one rank, the sinks split by heads.
The --fallback BACKEND (ref_nomoe.so: ref.so without the moe slot) runs
the experts through the host's fallback (core/model/moe_exec.c: top-k
softmax routing, expert biases by add calls): its logits within TOL and
its greedy tokens ref.so's. Each --gpu BACKEND (gpuemu.so, gpuemu64.so:
the GPU kernels, emulated, with their moe slot, attention sinks and
clamped SwiGLU) in exact mode (LOOM_GPU_EXACT=1): logits within GPU_TOL
of the reference and greedy tokens exactly ref.so's. OLD_ABI_BACKENDs (ABI 1.1, before attention
sinks) must refuse the file with a message naming the sinks.

Exit 77 (skip) when numpy or gguf are missing.
"""

import os
import sys
import tempfile
import time

TOL = 1e-3
FAST_TOL = 0.05
GPU_TOL = 5e-3  # as test_moe.py's: the emulated GPU's exact mode
N_GEN = 12
PROMPT = "the quick brown fox jumps over the lazy dog and then it runs"
SMALL = ["--layers", "2", "--heads", "4", "--kv-heads", "2", "--ctx", "256",
         "--embd", "64", "--vocab", "300", "--ff", "128", "--expert-ff",
         "64", "--experts", "4", "--experts-used", "2", "--arch", "gpt-oss"]
CASES = (("gpt-oss-f32", ["--type", "f32"]),
         ("gpt-oss-mxfp4", ["--type", "mxfp4"]))
FEATURES = ("sinks", "clamp", "yarn", "window", "router-bias",
            "softmax-all")


def variant_logits(np, ref_llama, path, feature, ids):
    m = ref_llama.Model(path, np.float64)
    if feature == "sinks":
        m.sinks = False
    elif feature == "clamp":
        m.oss_clamp = False
    elif feature == "yarn":
        m.yarn = 0.0
    elif feature == "window":
        m.window = 0
    elif feature == "router-bias":
        for L in m.layers:
            L["ffn_gate_inp.bias"] = None
    elif feature == "softmax-all":
        m.topk_softmax = False
        m.expert_norm = False
    return m.forward(ids, 0, m.new_cache())[-1]


def check_gpu(synth, np, moe, loom, path, name, first, want, gpus, tmp,
              fails):
    """The GPU backends (exact mode) against the reference and ref.so."""
    for be in gpus:
        tag = "%s %s" % (name, os.path.basename(be))
        try:
            logits, toks = moe.loom_logits(synth, np, loom, path, be, tmp,
                                           {"LOOM_GPU_EXACT": "1"})
        except (RuntimeError, OSError) as e:
            fails.check(False, "%s: loom run: %s" % (tag, e))
            continue
        moe.check_logits(np, fails, tag, first, logits, GPU_TOL)
        fails.check(toks == want and len(toks) > 0,
                    "%s: exact greedy tokens are ref.so's (%d): %s" %
                    (tag, len(want), toks))


def one_case(synth, np, ref_llama, moe, loom, mkgguf, tmp, seed, case, old,
             fallback, gpus, fails):
    name, args = case
    path = os.path.join(tmp, name + ".gguf")
    synth.run([sys.executable, mkgguf, path, "-q", "--seed", str(seed)] +
              SMALL + args)
    ref = ref_llama.Model(path, np.float64)
    ids = synth.parse_ids(synth.run([loom, "tokenize", "--model", path,
                                     "--no-bos", PROMPT]))
    ids = [int(ref.meta("tokenizer.ggml.bos_token_id"))] + ids
    eos = int(ref.meta("tokenizer.ggml.eos_token_id", -1))
    first, out, steps = ref.generate(ids, N_GEN)
    scale = float(np.max(np.abs(first)))
    for feat in FEATURES:
        alt = variant_logits(np, ref_llama, path, feat, ids)
        moved = float(np.max(np.abs(alt - first))) / scale
        fails.check(moved > 10 * TOL, "%s: reference without '%s' moves "
                    "logits by %.3g > %g" % (name, feat, moved, 10 * TOL))
    exact = {"LOOM_CPU_EXACT": "1"}
    got = {}
    for be in ("ref.so", "cpu.so") + tuple(fallback):
        tag = "%s %s" % (name, os.path.basename(be))
        logits, toks = moe.loom_logits(synth, np, loom, path, be, tmp, exact)
        got[be] = toks
        moe.check_logits(np, fails, tag, first, logits, TOL)
        ok, msg = synth.compare_tokens(out, steps, eos, toks, TOL * scale)
        fails.check(ok, "%s: greedy tokens: %s" % (tag, msg))
    fails.check(got["cpu.so"] == got["ref.so"] and len(got["ref.so"]) > 0,
                "%s: cpu.so --exact greedy tokens are ref.so's (%d)" %
                (name, len(got["ref.so"])))
    check_gpu(synth, np, moe, loom, path, name, first, got["ref.so"], gpus,
              tmp, fails)
    moe.check_fast(synth, np, loom, path, name, first, tmp, fails)
    if name.endswith("mxfp4"):  # biases split or added once, sinks per rank
        moe.check_tp(loom, path, name, tmp, fails)
    for be in old:
        import subprocess
        p = subprocess.run([loom, "run", "--backend=" + be, "--model", path,
                            "-p", "a", "-n", "1"], capture_output=True,
                           timeout=60)
        err = p.stderr.decode(errors="replace")
        fails.check(p.returncode not in (0, -11, -6) and
                    "needs attention sinks" in err,
                    "%s: %s refused: %r" % (name, os.path.basename(be),
                                            err.strip()[-160:]))


def main():
    if len(sys.argv) < 3:
        print("usage: test_gptoss.py LOOM_BINARY MKGGUF_PY [OLD_ABI_BACKEND ...]")
        return 2
    loom, mkgguf, old = sys.argv[1], sys.argv[2], sys.argv[3:]
    fallback, gpus = [], []
    if old[:1] == ["--fallback"] and len(old) >= 2:
        fallback, old = old[1:2], old[2:]
    while old[:1] == ["--gpu"] and len(old) >= 2:
        gpus.append(old[1])
        old = old[2:]
    try:
        import numpy as np
        import gguf  # noqa: F401
    except ImportError as e:
        print("SKIP: python module missing: %s" % e)
        return 77
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    sys.path.insert(0, os.path.join(here, "..", "e2e"))
    import ref_llama
    import test_synth as synth
    import test_moe as moe

    t0 = time.time()
    fails = synth.Failures()
    with tempfile.TemporaryDirectory(prefix="loom-gptoss-") as tmp:
        for seed, case in enumerate(CASES):
            try:
                one_case(synth, np, ref_llama, moe, loom, mkgguf, tmp, seed,
                         case, old, fallback, gpus, fails)
            except (RuntimeError, OSError, ValueError, KeyError) as e:
                fails.check(False, "%s: %s" % (case[0], e))
    print("%.1f s" % (time.time() - t0))
    if fails.list:
        print("%d check(s) failed" % len(fails.list))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
