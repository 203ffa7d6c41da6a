#!/usr/bin/env python3
"""`loom quantize --strategy imatrix` on SmolLM2-135M (LOOM_MODEL, Q4_1,
requantized: its weights dequantized are the source) against rtn: with an
importance matrix from `loom imatrix` over one text (GPL-2, 4 chunks of 64
tokens), Q4_0's mean KL divergence from the source over another text
(GPL-3, 3 chunks of 64 tokens, `loom perplexity --kl-base`) is below
rtn's by at least MIN_GAIN. A cheap setting: the figures of
docs/QUANTIZATION.md use longer texts.
Usage: test_imatrix_kl.py LOOM_EXE
"""
import os
import re
import subprocess
import sys
import tempfile

LOOM = sys.argv[1]
MODEL = os.environ.get("LOOM_MODEL", "")
CALIB = "/usr/share/common-licenses/GPL-2"
EVAL = "/usr/share/common-licenses/GPL-3"
MIN_GAIN = 0.15  # imatrix's KL at most 85 % of rtn's


def run(*args):
    p = subprocess.run([LOOM] + list(args), capture_output=True, text=True, timeout=600)
    if p.returncode:
        sys.exit("FAIL: loom %s\n%s" % (" ".join(args), p.stderr[-2000:]))
    return p.stdout + p.stderr


def kl(model, base):
    out = run("perplexity", "-m", model, "-f", EVAL, "-c", "64", "--chunks", "3", "-t", "2",
              "--kl-base", base)
    m = re.search(r"KL divergence: mean ([0-9.]+)", out)
    if not m:
        sys.exit("FAIL: no KL divergence in:\n" + out)
    return float(m.group(1))


def main():
    if not os.path.exists(MODEL):
        print("SKIP: no model (LOOM_MODEL)")
        sys.exit(77)
    with tempfile.TemporaryDirectory() as tmp:
        im = os.path.join(tmp, "imatrix.dat")
        base = os.path.join(tmp, "base.kld")
        run("imatrix", "-m", MODEL, "-f", CALIB, "-o", im, "-c", "64", "--chunks", "4", "-t", "2")
        run("perplexity", "-m", MODEL, "-f", EVAL, "-c", "64", "--chunks", "3", "-t", "2",
            "--save-logits", base)
        res = {}
        for s in ["rtn", "imatrix"]:
            out = os.path.join(tmp, s + ".gguf")
            run("quantize", MODEL, out, "Q4_0", "--allow-requantize", "--strategy", s,
                "--imatrix", im, "-t", "2")
            res[s] = kl(out, base)
        print("Q4_0 mean KL: rtn %.4f, imatrix %.4f (%.2f of rtn's)" %
              (res["rtn"], res["imatrix"], res["imatrix"] / res["rtn"]))
        if not res["imatrix"] < (1 - MIN_GAIN) * res["rtn"]:
            sys.exit("FAIL: the imatrix strategy's KL is not %d %% below rtn's" %
                     (100 * MIN_GAIN))
    print("ok")


if __name__ == "__main__":
    main()
