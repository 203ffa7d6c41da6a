#!/usr/bin/env python3
"""Synthetic-model test: loom against the NumPy reference on the families
and variants that the real test models (SmolLM2, Gemma 3 270M) do not
exercise.

Usage: test_synth.py LOOM_BINARY MKGGUF_PY [OLD_ABI_BACKEND]

For each case below, tools/mkgguf.py writes a small random model (2 layers,
GQA 4 query / 2 KV heads) into a temporary folder, and for each backend
(cpu.so, ref.so):
  - `loom tokenize --no-bos` must give ids that spell the prompt back
    (checked with the GGUF vocabulary, not with loom);
  - the logits of the last prompt position must match the reference
    (tests/e2e/ref_llama.py, float64, weights dequantized by the gguf
    package): max|loom - ref| / max|ref| < TOL and the same top-1 token;
  - the greedy continuation of N_GEN tokens must equal the reference's,
    except after a near tie (see below) or where loom stops at EOS.
Cases: qwen2 (attention biases, NEOX rope), llama with linear rope scaling,
llama with rope_freqs, llama with an untied output, a tied one, and the
weight formats f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1 spread over them;
gemma3 (GELU-tanh, QK-norm, post-norms, sqrt(n_embd) embedding scale) with
a sliding window of 8 or 3 tokens: the prompt (~50 tokens) and the
continuation span many windows, so every local layer must see exactly its
window, and the global layers (every 6th by default, every 3rd from the
file's sliding_window_pattern) everything, with their own RoPE base;
qwen3 (QK-norm, no biases); phi3 (fused attn_qkv and gate+up ffn_up, once
with LongRoPE's short/long factors and attention factor, once without);
gemma2 with small soft-caps (attention 4, logits 6) and a window of 6 on
every other layer, and with the family's default caps (50, 30: no keys);
mistral (general.architecture "mistral") with a 5-token window on every
layer; llama with Llama 3.1's rope_freqs (the converter's rule) and a
4-token window.

The reference also has to show that each case is worth running: its logits
must not be flat (their standard deviation is at least MIN_SPREAD), and the
feature under test must matter: the reference run without it (rope in the
other mode, biases dropped, scaling or frequency factors off, output tied
instead of untied, soft-caps off, the short LongRoPE factors instead of
the long ones, no attention factor, a fused matrix split in the wrong
order) must move the logits by more than 100 * TOL, so an engine that
ignored it would fail. Two Gemma 3 features are subtler on a
random model and need only 10 * TOL (still 10x what the logits check
allows, and 1e4x loom's measured error of ~1e-7): GELU-tanh against SiLU
(similar curves), and the local layers' RoPE base (a window of a few
tokens leaves only small relative positions to rotate). Gemma 2's default
caps (50, 30) bend random-model logits of ~10 by ~5%: 10 * TOL as well.
Soft-caps keep the argmax (tanh is monotonic), so the logits check, not
the greedy tokens, is what catches a cap left out: measured, dropping
the final cap moves loom's logits by 5.1 (relative), the attention cap
by 0.62 (small caps) and 4e-3 (defaults), all far over TOL.

TOL = 1e-3, as in tests/e2e: the reference's own error is negligible
(float64 from the same dequantized weights); loom's float32 accumulation
differs by ~1e-6 relative on these short dot products (64..256 terms, 2
layers); any real mistake (wrong rope pairing, missing bias, scaling not
applied, wrong GQA head mapping) moves logits by whole units.
Near ties: a backend may move the gap between two logits by up to
2 * TOL * max|ref|, so where the reference's top two are closer than that,
a different choice is accepted (and said); any other difference fails.

OLD_ABI_BACKEND (ref_abi11.so: ref.so's operators behind a generation-1.1
table, without the softcap slot) also runs the soft-capped cases, so the
executor's host-side final-logit cap is held to the same checks.

Exit 77 (skip) when numpy or gguf are missing.
"""

import os
import subprocess
import sys
import tempfile
import time

TOL = 1e-3
N_GEN = 16
MIN_SPREAD = 0.5
WEAK_FEATURES = {"gelu": 10, "localbase": 10,
                 "default_caps": 10}  # else 100 (see above)
RUN_TIMEOUT = 60
BACKENDS = ("cpu.so", "ref.so")
PROMPT = ("the quick brown fox jumps over the lazy dog and then it runs "
          "back home to eat")

SMALL = ["--layers", "2", "--heads", "4", "--kv-heads", "2", "--ctx", "256"]
# (name, mkgguf arguments, feature the reference must depend on)
CASES = (
    ("qwen2-bias-neox-f32", ["--arch", "qwen2", "--embd", "64", "--ff",
                             "128", "--vocab", "320", "--type", "f32"],
     ("neox", "bias")),
    ("qwen2-bias-neox-q5_0", ["--arch", "qwen2", "--embd", "128", "--ff",
                              "256", "--vocab", "400", "--type", "q5_0",
                              "--tied"], ("neox", "bias")),
    ("llama-rope-linear-q8_0", ["--embd", "128", "--ff", "256", "--vocab",
                                "512", "--type", "q8_0", "--rope-scale",
                                "4.0"], ("norm", "scale")),
    ("llama-rope-freqs-q4_1", ["--embd", "64", "--ff", "192", "--vocab",
                               "300", "--type", "q4_1", "--rope-freqs"],
     ("norm", "freqs")),
    ("llama-untied-q4_0", ["--embd", "128", "--ff", "256", "--vocab", "512",
                           "--type", "q4_0"], ("norm", "untied")),
    ("llama-tied-f16", ["--embd", "64", "--ff", "128", "--vocab", "300",
                        "--type", "f16", "--tied"], ("norm",)),
    ("llama-scale-freqs-q5_1", ["--embd", "128", "--ff", "256", "--vocab",
                                "400", "--type", "q5_1", "--rope-scale",
                                "2.0", "--rope-freqs"],
     ("norm", "scale", "freqs")),
    ("gemma3-window8-q8_0", ["--arch", "gemma3", "--layers", "6", "--embd",
                             "128", "--ff", "256", "--vocab", "400",
                             "--type", "q8_0", "--tied", "--window", "8"],
     ("neox", "window", "qknorm", "postnorm", "gelu", "embdscale",
      "localbase")),
    ("gemma3-window3-pattern3-f16", ["--arch", "gemma3", "--layers", "3",
                                     "--embd", "64", "--ff", "128",
                                     "--vocab", "300", "--type", "f16",
                                     "--window", "3", "--swa-pattern", "3"],
     ("window", "pattern", "localbase")),
    ("qwen3-qknorm-q8_0", ["--arch", "qwen3", "--embd", "128", "--ff", "256",
                           "--vocab", "400", "--type", "q8_0"],
     ("neox", "qknorm")),
    ("phi3-fused-longrope-q8_0", ["--arch", "phi3", "--embd", "128", "--ff",
                                  "256", "--vocab", "400", "--type", "q8_0",
                                  "--rope-factors"],
     ("neox", "freqs", "short", "attnfactor", "gateorder", "kvorder")),
    ("phi3-fused-f32", ["--arch", "phi3", "--embd", "64", "--ff", "128",
                        "--vocab", "300", "--type", "f32", "--tied"],
     ("neox", "gateorder", "kvorder")),
    ("gemma2-softcap-window6-q8_0", ["--arch", "gemma2", "--layers", "4",
                                     "--embd", "128", "--ff", "256",
                                     "--vocab", "400", "--type", "q8_0",
                                     "--tied", "--window", "6",
                                     "--attn-softcap", "4",
                                     "--final-softcap", "6"],
     ("neox", "window", "postnorm", "gelu", "embdscale", "attn_softcap",
      "final_softcap")),
    ("gemma2-default-caps-f16", ["--arch", "gemma2", "--embd", "64", "--ff",
                                 "128", "--vocab", "300", "--type", "f16"],
     ("default_caps",)),
    ("mistral-window5-q4_0", ["--arch", "mistral", "--embd", "128", "--ff",
                              "256", "--vocab", "512", "--type", "q4_0",
                              "--window", "5"], ("norm", "window")),
    ("llama31-rope-window4-f16", ["--embd", "64", "--ff", "128", "--vocab",
                                  "300", "--type", "f16", "--rope-base",
                                  "500000", "--rope-llama3", "32",
                                  "--window", "4"],
     ("norm", "freqs", "window")),
)


def skip(msg):
    print("SKIP: " + msg)
    sys.exit(77)


class Failures:
    def __init__(self):
        self.list = []

    def check(self, ok, msg):
        print(("ok:   " if ok else "FAIL: ") + msg)
        if not ok:
            self.list.append(msg)
        return ok


def run(cmd, timeout=RUN_TIMEOUT):
    what = " ".join(os.path.basename(c) for c in cmd[:2])
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError("%s did not finish in %d s (hung?)" %
                           (what, timeout))
    if p.returncode != 0:
        err = p.stderr.decode(errors="replace").strip()
        raise RuntimeError("%s exited %d: %s" %
                           (what, p.returncode, err[-2000:]))
    return p.stdout.decode(errors="replace")


def parse_ids(text):
    return [int(t) for t in text.split()]


def loom_generate(np, loom, model, backend, tmp):
    lpath = os.path.join(tmp, "logits.f32")
    tpath = os.path.join(tmp, "tokens.txt")
    for p in (lpath, tpath):
        if os.path.exists(p):
            os.unlink(p)
    # an f32 KV cache: the tolerances below are for f32 arithmetic against
    # the float64 reference (the default f16 cache rounds K and V)
    run([loom, "run", "--backend=" + backend, "--model", model,
         "-p", PROMPT, "-n", str(N_GEN), "--temp", "0", "--kv-type", "f32",
         "--dump-logits", lpath, "--dump-tokens", tpath])
    logits = np.fromfile(lpath, dtype="<f4")
    with open(tpath) as f:
        return logits, parse_ids(f.read())


def compare_tokens(ref_out, steps, eos, got, abs_tol):
    """(ok, message) for a backend's greedy ids against the reference."""
    for i, w in enumerate(ref_out):
        if i == len(got):
            # loom stops after EOS without listing it, or right at it
            if w == eos:
                return True, "matched %d tokens, then EOS" % i
            return False, "got %d tokens, want %d" % (len(got), len(ref_out))
        g = got[i]
        if g == w:
            if w == eos:
                return True, "matched %d tokens up to EOS" % (i + 1)
            continue
        if not 0 <= g < len(steps[i]):
            return False, "token %d: id %d out of range" % (i, g)
        gap = float(steps[i][w] - steps[i][g])
        if gap <= 2 * abs_tol:
            return True, ("matched %d tokens, then a near tie (gap %.3g <= "
                          "%.3g): took %d for %d" % (i, gap, 2 * abs_tol,
                                                     g, w))
        return False, ("token %d differs: got %d, reference %d (gap %.3g > "
                       "%.3g)" % (i, g, w, gap, 2 * abs_tol))
    if len(got) != len(ref_out):
        return False, "got %d tokens, want %d" % (len(got), len(ref_out))
    return True, "matched all %d tokens" % len(got)


def check_logits(np, fails, tag, ref, got):
    if not fails.check(got.shape == ref.shape,
                       "%s: %d logits (want %d)" % (tag, got.size, ref.size)):
        return
    if not fails.check(bool(np.all(np.isfinite(got))),
                       "%s: logits finite" % tag):
        return
    err = float(np.max(np.abs(got.astype(np.float64) - ref)))
    scale = float(np.max(np.abs(ref)))
    fails.check(err / scale < TOL,
                "%s: logits max|diff| %.3g / max|ref| %.3g = %.3g < %g" %
                (tag, err, scale, err / scale, TOL))
    fails.check(int(np.argmax(got)) == int(np.argmax(ref)),
                "%s: top-1 %d (ref %d)" %
                (tag, int(np.argmax(got)), int(np.argmax(ref))))


def variant_logits(np, ref_llama, path, feature, ids):
    """Reference logits with `feature` switched off (or flipped)."""
    m = ref_llama.Model(path, np.float64)
    if feature == "neox":
        m.rope_mode = ref_llama.ROPE_NORM
    elif feature == "norm":
        m.rope_mode = ref_llama.ROPE_NEOX
    elif feature == "bias":
        for L in m.layers:
            for n in ("attn_q", "attn_k", "attn_v"):
                L[n + ".bias"] = None
    elif feature == "scale":
        m.rope_factor = 1.0
    elif feature == "freqs":
        m.rope_freqs = None
    elif feature == "untied":
        m.output = m.tok_embd
    elif feature == "window":
        m.window = 0
    elif feature == "pattern":
        m.pattern = 6      # the rule without the file's key: all local
    elif feature == "qknorm":
        for L in m.layers:
            L["attn_q_norm"] = L["attn_k_norm"] = None
    elif feature == "postnorm":
        for L in m.layers:
            L["post_attention_norm"] = L["post_ffw_norm"] = None
    elif feature == "gelu":
        m.act = "silu"
    elif feature == "embdscale":
        m.embd_scale = 1.0
    elif feature == "localbase":
        m.local_base = m.rope_base
    elif feature == "attn_softcap":
        m.attn_softcap = 0.0
    elif feature == "final_softcap":
        m.final_softcap = 0.0
    elif feature == "default_caps":
        m.attn_softcap = m.final_softcap = 0.0
    elif feature == "short":      # the short LongRoPE factors instead
        m.rope_freqs = m.weight("rope_factors_short.weight")
    elif feature == "attnfactor":
        m.rope_attn_factor = 1.0
    elif feature == "gateorder":  # fused ffn_up read as [up; gate]
        for L in m.layers:
            L["ffn_gate"], L["ffn_up"] = L["ffn_up"], L["ffn_gate"]
    elif feature == "kvorder":    # fused attn_qkv read as [Q; V; K]
        for L in m.layers:
            L["attn_k"], L["attn_v"] = L["attn_v"], L["attn_k"]
    return m.forward(ids, 0, m.new_cache())[-1]


CAPPED = ("final_softcap", "default_caps")


def one_case(np, ref_llama, loom, mkgguf, tmp, seed, name, args, features,
             fails, old_backend=None):
    print("== %s: mkgguf %s" % (name, " ".join(args)))
    path = os.path.join(tmp, name + ".gguf")
    run([sys.executable, mkgguf, path, "-q", "--seed", str(seed)] +
        SMALL + args)
    ref = ref_llama.Model(path, np.float64)
    ids = parse_ids(run([loom, "tokenize", "--model", path, "--no-bos",
                         PROMPT]))
    fails.check(len(ids) > 0 and ref.detokenize(ids) == PROMPT,
                "%s: tokenize: %d ids spell the prompt back" %
                (name, len(ids)))
    if ref.meta("tokenizer.ggml.add_bos_token", False):
        ids = [int(ref.meta("tokenizer.ggml.bos_token_id"))] + ids
    eos = int(ref.meta("tokenizer.ggml.eos_token_id", -1))
    first, out, steps = ref.generate(ids, N_GEN)
    spread = float(np.std(first))
    fails.check(spread >= MIN_SPREAD, "%s: reference logits spread (std "
                "%.3g >= %g)" % (name, spread, MIN_SPREAD))
    scale = float(np.max(np.abs(first)))
    for feat in features:
        alt = variant_logits(np, ref_llama, path, feat, ids)
        moved = float(np.max(np.abs(alt - first))) / scale
        need = WEAK_FEATURES.get(feat, 100) * TOL
        fails.check(moved > need, "%s: reference without '%s' moves "
                    "logits by %.3g > %g" % (name, feat, moved, need))
    abs_tol = TOL * scale
    got = {}
    backends = BACKENDS
    if old_backend and any(f in CAPPED for f in features):
        backends = BACKENDS + (old_backend,)
    for be in backends:
        tag = "%s %s [%d tokens]" % (name, os.path.basename(be), len(ids))
        try:
            logits, toks = loom_generate(np, loom, path, be, tmp)
        except (RuntimeError, OSError) as e:
            fails.check(False, "%s: loom run: %s" % (tag, e))
            continue
        check_logits(np, fails, tag, first, logits)
        ok, msg = compare_tokens(out, steps, eos, toks, abs_tol)
        fails.check(ok, "%s: greedy tokens: %s" % (tag, msg))
        got[be] = toks
    if BACKENDS[0] in got and BACKENDS[1] in got and \
            got[BACKENDS[0]] != got[BACKENDS[1]]:
        print("note: %s and %s took different paths (both accepted above)"
              % BACKENDS)


def main():
    if len(sys.argv) not in (3, 4):
        print("usage: test_synth.py LOOM_BINARY MKGGUF_PY [OLD_ABI_BACKEND]")
        return 2
    loom, mkgguf = sys.argv[1], sys.argv[2]
    old_backend = sys.argv[3] if len(sys.argv) == 4 else None
    # the tolerances are for f32 activations: cpu.so's exact mode (its
    # default fast mode quantizes activations to 8 bits)
    os.environ["LOOM_CPU_EXACT"] = "1"
    try:
        import numpy as np
        import gguf  # noqa: F401
    except ImportError as e:
        skip("python module missing: %s" % e)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "e2e"))
    import ref_llama

    t0 = time.time()
    fails = Failures()
    with tempfile.TemporaryDirectory(prefix="loom-synth-") as tmp:
        for seed, (name, args, features) in enumerate(CASES):
            try:
                one_case(np, ref_llama, loom, mkgguf, tmp, seed, name, args,
                         features, fails, old_backend)
            except (RuntimeError, OSError, ValueError, KeyError) as e:
                fails.check(False, "%s: %s" % (name, e))
    print("%.1f s" % (time.time() - t0))
    if fails.list:
        print("%d check(s) failed" % len(fails.list))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
