#!/usr/bin/env python3
"""Sliding-window KV cache on a prompt many windows long, against NumPy.

Usage: test_swa.py LOOM_BINARY MKGGUF_PY

tools/mkgguf.py writes a random Gemma 3 model (6 layers: 5 local with a
window of WINDOW tokens, 1 global), and `loom run` reads a prompt of about
9 windows in prompt chunks of CHUNK tokens (-b) over KV blocks of BS tokens
(--block-size), then decodes N_GEN tokens, on cpu.so and ref.so. The KV
manager keeps the local layers in a pool of their own and releases the
blocks behind their window as the sequence advances, so:
  - the last prompt position's logits match the float64 reference
    (tests/e2e/ref_llama.py, which masks by window over a full cache and
    shares no code with loom): max|loom - ref| / max|ref| < TOL, same top-1;
  - the greedy tokens equal the reference's (near ties as in test_synth);
  - the reference without the window moves the logits by > 100 * TOL, so a
    KV manager that lost or misplaced a block inside the window would fail;
  - loom's KV line ("loom: KV blocks held at most: ...") shows the local
    layers' pool held at most the blocks that a window plus one chunk can
    touch, floor((WINDOW + CHUNK - 2) / BS) + 2 (derived here from the
    positions, not taken from loom), while the global layers held a block
    for every BS tokens of the context, far more.
TOL = 1e-3 as in tests/synth and tests/e2e (loom's float32 error here is
~1e-6 relative). Exit 77 (skip) when numpy or gguf are missing.
"""

import os
import random
import re
import sys
import tempfile

WINDOW = 16
BS = 4
CHUNK = 24
N_GEN = 24
N_WORDS = 120
MODEL_ARGS = ["--arch", "gemma3", "--layers", "6", "--heads", "4",
              "--kv-heads", "2", "--embd", "64", "--ff", "128", "--vocab",
              "300", "--ctx", "512", "--type", "q8_0", "--tied",
              "--window", str(WINDOW), "--seed", "23"]
KV_LINE = re.compile(r"loom: KV blocks held at most: full-context layers "
                     r"(\d+) \(plan \d+ per sequence\), (\d+) windowed "
                     r"layers \(window (\d+)\) (\d+) \(plan (\d+) per "
                     r"sequence\), blocks of (\d+) tokens")


def long_prompt(words):
    rng = random.Random(5)
    return " ".join(rng.choice(words) for _ in range(N_WORDS))


def window_bound(window, chunk, bs):
    """Blocks a reservation of chunk tokens at p touches when the blocks
    below p - window + 1 are gone: positions p - window + 1 .. p + chunk - 1
    (window + chunk - 1 of them) start anywhere in a block."""
    return (window + chunk - 2) // bs + 2


def loom_run(st, loom, model, backend, prompt, tmp):
    lpath = os.path.join(tmp, "logits.f32")
    tpath = os.path.join(tmp, "tokens.txt")
    for p in (lpath, tpath):
        if os.path.exists(p):
            os.unlink(p)
    cmd = [loom, "run", "--backend=" + backend, "--model", model,
           "-p", prompt, "-n", str(N_GEN), "--temp", "0", "-c", "512", "--kv-type", "f32",
           "-b", str(CHUNK), "--block-size", str(BS), "--dump-logits", lpath,
           "--dump-tokens", tpath]
    import subprocess
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=st.RUN_TIMEOUT)
    err = p.stderr.decode(errors="replace")
    if p.returncode != 0:
        raise RuntimeError("loom run exited %d: %s" %
                           (p.returncode, err[-2000:]))
    import numpy as np
    with open(tpath) as f:
        toks = st.parse_ids(f.read())
    return np.fromfile(lpath, dtype="<f4"), toks, err


def check_kv_line(fails, tag, err, n_ctx_tokens):
    m = KV_LINE.search(err)
    if not fails.check(m is not None, "%s: loom prints its KV line" % tag):
        return
    glob, n_local, window, local, plan, bs = (int(g) for g in m.groups())
    bound = window_bound(WINDOW, CHUNK, BS)
    fails.check((n_local, window, bs) == (5, WINDOW, BS),
                "%s: 5 windowed layers, window %d, blocks of %d tokens "
                "(got %d, %d, %d)" % (tag, WINDOW, BS, n_local, window, bs))
    fails.check(0 < local <= bound,
                "%s: local layers held at most %d blocks <= %d (a window "
                "and a chunk)" % (tag, local, bound))
    fails.check(plan <= bound, "%s: the plan counts %d local blocks per "
                "sequence <= %d" % (tag, plan, bound))
    need = -(-n_ctx_tokens // BS)
    fails.check(glob >= need and glob > 2 * local,
                "%s: global layers held %d blocks >= %d (every position) "
                "and > 2 x the local %d" % (tag, glob, need, local))


def main():
    if len(sys.argv) != 3:
        print("usage: test_swa.py LOOM_BINARY MKGGUF_PY")
        return 2
    loom, mkgguf = sys.argv[1], sys.argv[2]
    os.environ["LOOM_CPU_EXACT"] = "1"  # the tolerance is for f32 sums
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    sys.path.insert(0, os.path.join(here, "..", "e2e"))
    import test_synth as st
    try:
        import numpy as np
        import gguf  # noqa: F401
    except ImportError as e:
        st.skip("python module missing: %s" % e)
    import ref_llama

    fails = st.Failures()
    with tempfile.TemporaryDirectory(prefix="loom-swa-") as tmp:
        path = os.path.join(tmp, "swa.gguf")
        st.run([sys.executable, mkgguf, path, "-q"] + MODEL_ARGS)
        ref = ref_llama.Model(path, np.float64)
        prompt = long_prompt(st.PROMPT.split())
        ids = st.parse_ids(st.run([loom, "tokenize", "--model", path,
                                   "--no-bos", prompt]))
        fails.check(ref.detokenize(ids) == prompt,
                    "tokenize: %d ids spell the prompt back" % len(ids))
        if ref.meta("tokenizer.ggml.add_bos_token", False):
            ids = [int(ref.meta("tokenizer.ggml.bos_token_id"))] + ids
        fails.check(len(ids) >= 6 * WINDOW, "prompt of %d tokens is %.1f "
                    "windows" % (len(ids), len(ids) / WINDOW))
        eos = int(ref.meta("tokenizer.ggml.eos_token_id", -1))
        first, out, steps = ref.generate(ids, N_GEN)
        scale = float(np.max(np.abs(first)))
        alt = st.variant_logits(np, ref_llama, path, "window", ids)
        moved = float(np.max(np.abs(alt - first))) / scale
        fails.check(moved > 100 * st.TOL, "reference without the window "
                    "moves logits by %.3g > %g" % (moved, 100 * st.TOL))
        for be in st.BACKENDS:
            tag = "%s [%d tokens]" % (be, len(ids))
            try:
                logits, toks, err = loom_run(st, loom, path, be, prompt, tmp)
            except (RuntimeError, OSError) as e:
                fails.check(False, "%s: loom run: %s" % (tag, e))
                continue
            st.check_logits(np, fails, tag, first, logits)
            ok, msg = st.compare_tokens(out, steps, eos, toks, st.TOL * scale)
            fails.check(ok, "%s: greedy tokens: %s" % (tag, msg))
            check_kv_line(fails, tag, err, len(ids) + len(toks) - 1)
    if fails.list:
        print("%d check(s) failed" % len(fails.list))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
