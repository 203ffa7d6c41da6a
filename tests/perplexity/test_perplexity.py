#!/usr/bin/env python3
"""`loom perplexity` against an independent NumPy reference.

On a Debian licence text (the base system ships it), with small chunks:
  - the perplexity loom prints equals exp(mean NLL) computed by
    tests/e2e/ref_llama.py (float64 NumPy, no loom code) over the same
    chunks and scored positions, within PPL_REL;
  - the --save-logits file holds the chunk tokens loom scored (BOS first)
    and, per scored position, log-probs within LP_TOL of the reference's
    (half floats: 2^-6 apart near 30);
  - --kl-base against its own exact run: KL ~ 0 and top-1 agreement 100 %;
    against the fast mode: KL small and stated (printed, bounded by KL_FAST);
    the same through the prefill GEMM (--prefill-kernels);
  - misuse is refused with a message: a base of another chunk size, both
    files at once, a text shorter than one chunk.
Usage: test_perplexity.py LOOM_EXE (LOOM_MODEL names the model).
"""
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))

TEXT = "/usr/share/common-licenses/GPL-3"
CTX, CHUNKS = 64, 2
PPL_REL = 2e-3
LP_TOL = 0.03
KL_FAST = 0.05
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def loom(exe, model, *extra, ok=True):
    cmd = [exe, "perplexity", "--model", model, "-f", TEXT, "-c", str(CTX),
           "--chunks", str(CHUNKS), "-t", "2"] + list(extra)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if ok and p.returncode != 0:
        sys.exit("FAIL: %s\n%s" % (" ".join(extra), p.stderr))
    return p


def read_base(path):
    with open(path, "rb") as f:
        assert f.read(8) == b"LOOMKLD1"
        n_vocab, n_ctx, n_chunks, _ = np.frombuffer(f.read(16), dtype=np.uint32)
        first = n_ctx // 2
        chunks = []
        for _ in range(n_chunks):
            toks = np.frombuffer(f.read(4 * n_ctx), dtype=np.int32)
            lp = np.frombuffer(f.read(2 * n_vocab * (n_ctx - 1 - first)), dtype=np.float16)
            chunks.append((toks, lp.reshape(n_ctx - 1 - first, n_vocab).astype(np.float64)))
    return int(n_ctx), first, chunks


def reference_nll(model_path, chunks, first):
    import ref_llama
    m = ref_llama.Model(model_path)
    out = []
    for toks, _ in chunks:
        logits = m.forward(toks.tolist(), 0, m.new_cache())
        z = logits - logits.max(axis=1, keepdims=True)
        lp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        out.append(lp[first:-1])
    return out


def main():
    exe = sys.argv[1]
    model = os.environ.get("LOOM_MODEL", "")
    if not os.path.isfile(model) or not os.path.isfile(TEXT):
        print("model %r or %s missing: skipping" % (model, TEXT))
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "base.kld")
        out = loom(exe, model, "--exact", "--save-logits", base).stdout
        ppl = float(re.search(r"^perplexity: ([0-9.]+)", out, re.M).group(1))
        n_ctx, first, chunks = read_base(base)
        check(n_ctx == CTX and len(chunks) == CHUNKS, "the file holds %d chunks of %d" % (CHUNKS, CTX))
        ref = reference_nll(model, chunks, first)
        nll = np.concatenate([-r[np.arange(len(r)), t[first + 1:]] for r, (t, _) in zip(ref, chunks)])
        ref_ppl = float(np.exp(nll.mean()))
        check(abs(ppl - ref_ppl) <= PPL_REL * ref_ppl,
              "perplexity %.4f equals the NumPy reference's %.4f" % (ppl, ref_ppl))
        err = max(float(np.abs(r - lp).max()) for r, (_, lp) in zip(ref, chunks))
        check(err <= LP_TOL, "saved log-probs within %g of the reference (max %.4f)" % (LP_TOL, err))

        out = loom(exe, model, "--exact", "--kl-base", base).stdout
        kl = float(re.search(r"KL divergence: mean ([0-9.e-]+)", out).group(1))
        top1 = float(re.search(r"top-1 agreement: ([0-9.]+)%", out).group(1))
        check(kl < 1e-5 and top1 == 100.0, "exact vs its own base: KL %g, top-1 %.2f%%" % (kl, top1))
        out = loom(exe, model, "--kl-base", base).stdout
        kl = float(re.search(r"KL divergence: mean ([0-9.e-]+)", out).group(1))
        print("fast mode vs exact base:", out.strip().splitlines()[-2:])
        check(kl < KL_FAST, "fast mode vs exact base: mean KL %g < %g" % (kl, KL_FAST))
        # the prefill GEMM instead of decode's kernels: exact mode only
        # reorders f32 sums; fast mode is held to the same bound
        out = loom(exe, model, "--exact", "--prefill-kernels", "--kl-base", base).stdout
        kl = float(re.search(r"KL divergence: mean ([0-9.e-]+)", out).group(1))
        check(kl < 1e-4, "exact prefill kernels vs exact base: mean KL %g < 1e-4" % kl)
        out = loom(exe, model, "--prefill-kernels", "--kl-base", base).stdout
        kl = float(re.search(r"KL divergence: mean ([0-9.e-]+)", out).group(1))
        print("fast prefill kernels vs exact base:", out.strip().splitlines()[-2:])
        check(kl < KL_FAST, "fast prefill kernels vs exact base: mean KL %g < %g" % (kl, KL_FAST))

        p = subprocess.run([exe, "perplexity", "--model", model, "-f", TEXT, "-c", "32",
                            "--chunks", "1", "--kl-base", base], capture_output=True, text=True)
        check(p.returncode != 0 and "context" in p.stderr, "a base of another -c is refused: %s" % p.stderr.strip())
        p = loom(exe, model, "--save-logits", base, "--kl-base", base, ok=False)
        check(p.returncode != 0 and "one or the other" in p.stderr, "both files at once are refused")
        short = os.path.join(tmp, "short.txt")
        with open(short, "w") as f:
            f.write("Too short.")
        p = subprocess.run([exe, "perplexity", "--model", model, "-f", short, "-c", "64"],
                           capture_output=True, text=True)
        check(p.returncode != 0 and "fewer than one chunk" in p.stderr, "a text shorter than a chunk is refused")
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
