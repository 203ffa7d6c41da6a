#!/usr/bin/env python3
"""End-to-end test on the real Gemma 3 270M (Q4_K_M) against ref_llama.py.

Usage: test_gemma3.py LOOM_BINARY
       (env LOOM_GEMMA_MODEL: the GGUF, default
        ~/.cache/loom/gemma-3-270m-q4_k_m.gguf; scripts/setup.sh fetches it)

The checks are test_reference.py's, on this model: for each prompt and
backend (cpu.so on both; ref.so, the slowest part of the test on this
262k vocabulary, on the second only: unlike cpu.so's, its code path does
not depend on the number of prompt rows), `loom tokenize` ids spell the
prompt back
(SentencePiece with Gemma's 262k vocabulary, checked with the GGUF
vocabulary, not with loom); the last prompt position's logits match the
float64 NumPy reference, max|loom - ref| / max|ref| < TOL = 1e-3, with
the same top-1; the 32 greedy tokens equal the reference's (or stop at
EOS), except after a near tie (reference top-two gap <= 2 * 1e-4 *
max|ref|); and the two backends agree.

TOL is the same as for SmolLM2 and holds for the same reason: the
reference computes in float64 from the same dequantized weights and loom's
float32 sums move logits by ~1e-5 of the largest through 18 layers; any
mistake in the Gemma path (norm placement, QK-norm, GELU, the sqrt(n_embd)
embedding scale, a RoPE base) moves them by whole units.

These prompts are far shorter than the 512-token window, so the window
itself is held to the reference by tests/synth (gemma3 cases, window 4).
Exit 77 when the model file or numpy/gguf are missing.
"""

import os
import subprocess
import sys
import tempfile

PROMPTS = (
    "The capital of France is",
    "Here is a short story about a robot who learns to paint. Once upon a"
    " time, in a small workshop,",
)


def main():
    if len(sys.argv) != 2:
        print("usage: test_gemma3.py LOOM_BINARY")
        return 2
    loom = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import test_reference as tr

    model = os.environ.get("LOOM_GEMMA_MODEL") or os.path.expanduser(
        "~/.cache/loom/gemma-3-270m-q4_k_m.gguf")
    if not os.path.isfile(model):
        tr.skip("Gemma 3 model not found (%s; run scripts/setup.sh)" % model)
    # the tolerances are for f32 activations: cpu.so's exact mode (its
    # default fast mode quantizes activations to 8 bits)
    os.environ["LOOM_CPU_EXACT"] = "1"
    had = "OPENBLAS_NUM_THREADS" in os.environ
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        import numpy as np
        import gguf  # noqa: F401
    except ImportError as e:
        tr.skip("python module missing: %s" % e)
    if not had:
        del os.environ["OPENBLAS_NUM_THREADS"]
    import ref_llama

    ref = ref_llama.Model(model, np.float64)
    if ref.arch != "gemma3":
        tr.skip("%s is a %s model, not gemma3" % (model, ref.arch))
    fails = tr.Failures()
    with tempfile.TemporaryDirectory(prefix="loom-gemma3-") as tmp:
        for i, prompt in enumerate(PROMPTS):
            backends = tr.BACKENDS if i == len(PROMPTS) - 1 else ("cpu.so",)
            try:
                tr.one_prompt(np, ref, loom, model, prompt, tmp, fails,
                              backends)
            except (RuntimeError, OSError, ValueError,
                    subprocess.TimeoutExpired) as e:
                fails.check(False, "prompt %r: %s" % (prompt, e))
    if fails.list:
        print("%d check(s) failed" % len(fails.list))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
