#!/usr/bin/env python3
"""Input scales folded by `loom quantize` keep the model's function.

For a random f32 llama (untied output) and a qwen2 (attention biases)
from tools/mkgguf.py, `loom quantize IN OUT f32 --strategy qs_fold.so`
(a strategy whose input_scales are fixed random powers of two in
[2^-1.5, 2^1.5], and whose quantize copies f32) must
  - write blk.N.attn_norm / ffn_norm divided by the scales and the
    columns of attn_q/k/v and ffn_gate/up multiplied by the same scales
    (checked from the files: W'/W = g/g' per column, the same s for every
    member of a group, and s not all 1);
  - leave the other tensors (attn_output, ffn_down, token_embd) as they
    were;
  - give the same logits: loom run --temp 0 on ref.so, last prompt
    position, max|a - b| / max|a| < 1e-4 (float32 rounding of two extra
    multiplications per weight; a scale applied on one side only moves
    the logits by whole units), and the same greedy tokens.
A strategy returning a NaN scale (qs_fold_bad_scale.so) is refused with
a message naming the tensor, and no output file is left.
Usage: test_fold.py LOOM_EXE MKGGUF_PY qs_fold.so qs_fold_bad_scale.so
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import gguf
except ImportError as e:
    print("SKIP: needs numpy and gguf (scripts/setup.sh --test): %s" % e)
    sys.exit(77)

LOOM, MKGGUF, FOLD, BAD = sys.argv[1:5]
PROMPT = "The quick brown fox jumps over the lazy dog, again and again."
TOL = 1e-4
failures = []


def run(cmd, check=True):
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                       timeout=120)
    if check and p.returncode != 0:
        print("FAIL: %s\n%s%s" % (" ".join(cmd), p.stdout, p.stderr))
        sys.exit(1)
    return p


def tensors(path):
    r = gguf.GGUFReader(path)
    return {t.name: np.array(t.data, dtype=np.float32).reshape(
        [int(x) for x in reversed(t.shape)]) for t in r.tensors}


def logits_and_tokens(model, tmp, tag):
    lp, tp = os.path.join(tmp, tag + ".f32"), os.path.join(tmp, tag + ".txt")
    run([LOOM, "run", "--backend=ref.so", "--model", model, "-p", PROMPT, "-n", "8",
         "--temp", "0", "--dump-logits", lp, "--dump-tokens", tp])
    with open(tp) as f:
        return np.fromfile(lp, dtype="<f4"), f.read().split()


def check_scales(a, b, layers):
    """The per-column ratio of each group member equals the norm's."""
    all_s = []
    for i in range(layers):
        for norm, members in (("attn_norm", ("attn_q", "attn_k", "attn_v")),
                              ("ffn_norm", ("ffn_gate", "ffn_up"))):
            key = "blk.%d.%s.weight" % (i, norm)
            s = a[key] / b[key]
            all_s.append(s)
            for m in members:
                mk = "blk.%d.%s.weight" % (i, m)
                ratio = b[mk] / a[mk]  # rows x cols: column j times s_j
                err = np.max(np.abs(ratio - s[None, :]) / s[None, :])
                if err > 1e-5:
                    failures.append("%s: columns scaled by %g off the norm's scales" % (mk, err))
        for same in ("attn_output", "ffn_down"):
            k = "blk.%d.%s.weight" % (i, same)
            if not np.array_equal(a[k], b[k]):
                failures.append("%s changed; it has no norm to fold into" % k)
    s = np.concatenate(all_s)
    if s.min() > 0.6 or s.max() < 1.6:
        failures.append("scales %g..%g: folding did not happen" % (s.min(), s.max()))


def one_model(tmp, arch, extra):
    src, out = os.path.join(tmp, arch + ".gguf"), os.path.join(tmp, arch + "_fold.gguf")
    run([sys.executable, MKGGUF, src, "--arch", arch, "--type", "f32", "--layers", "2",
         "--seed", "3", "-q"] + extra)
    p = run([LOOM, "quantize", src, out, "f32", "--strategy", FOLD, "-t", "2"])
    a, b = tensors(src), tensors(out)
    check_scales(a, b, 2)
    if not np.array_equal(a["token_embd.weight"], b["token_embd.weight"]):
        failures.append("%s: token_embd changed" % arch)
    la, ta = logits_and_tokens(src, tmp, arch + "_a")
    lb, tb = logits_and_tokens(out, tmp, arch + "_b")
    rel = float(np.max(np.abs(la - lb)) / np.max(np.abs(la)))
    print("%s: logits after folding differ by %.2e of max|logit| (tolerance %g)" % (arch, rel, TOL))
    if not rel < TOL:
        failures.append("%s: folded logits differ by %.3g relative" % (arch, rel))
    if ta != tb:
        failures.append("%s: greedy tokens differ: %s vs %s" % (arch, ta, tb))


def bad_scale(tmp):
    src, out = os.path.join(tmp, "llama.gguf"), os.path.join(tmp, "bad.gguf")
    p = run([LOOM, "quantize", src, out, "q8_0", "--strategy", BAD], check=False)
    msg = p.stderr + p.stdout
    if p.returncode == 0 or "input scale" not in msg or "blk.0.attn_" not in msg:
        failures.append("NaN scale not refused by name: rc %d, %s" % (p.returncode, msg.strip()))
    if os.path.exists(out) or os.path.exists(out + ".part"):
        failures.append("a refused run left an output file")


def main():
    tmp = tempfile.mkdtemp(prefix="loom_fold_")
    try:
        one_model(tmp, "llama", [])
        one_model(tmp, "qwen2", [])
        bad_scale(tmp)
    finally:
        subprocess.run(["rm", "-rf", tmp])
    for f in failures:
        print("FAIL:", f)
    print("qstrategy_fold: %s" % ("FAIL" if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
