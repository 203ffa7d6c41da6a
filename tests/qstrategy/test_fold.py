#!/usr/bin/env python3
"""Input scales folded by `loom quantize` keep the model's function.

For random f32 llamas (untied output) and a qwen2 (attention biases)
from tools/mkgguf.py, `loom quantize IN OUT f32 --strategy qs_fold.so`
(a strategy whose input_scales are fixed random powers of two in
[2^-1.5, 2^1.5], and whose quantize copies f32) must
  - write blk.N.attn_norm / ffn_norm divided by the scales and the
    columns of attn_q/k/v and ffn_gate/up multiplied by the same scales
    (checked from the files: W'/W = g/g' per column, the same s for every
    member of a group, and s not all 1);
  - leave the other tensors (attn_output, ffn_down, token_embd) as they
    were;
  - give the same logits: loom run --temp 0 --kv-type f32 on ref.so, last prompt
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
    # f32 KV cache: an f16 one rounds the (differently rounded) folded K/V
    # to 2^-11 and moves the logits by ~1e-4, hiding what is measured here
    run([LOOM, "run", "--backend=ref.so", "--model", model, "-p", PROMPT, "-n", "8",
         "--temp", "0", "--kv-type", "f32", "--dump-logits", lp, "--dump-tokens", tp])
    with open(tp) as f:
        return np.fromfile(lp, dtype="<f4"), f.read().split()


def ratio_check(name, got, want):
    err = float(np.max(np.abs(got - want) / want))
    if err > 1e-5:
        failures.append("%s: scaled by %g off the expected scales" % (name, err))


def check_scales(a, b, layers, mha):
    """Each member's columns are scaled as its prev's output is divided."""
    all_s = []
    for i in range(layers):
        t = lambda f, n: f["blk.%d.%s.weight" % (i, n)]
        s_attn = t(a, "attn_norm") / t(b, "attn_norm")
        s_ffn = t(a, "ffn_norm") / t(b, "ffn_norm")
        s_down = (t(b, "ffn_down") / t(a, "ffn_down"))[0]
        s_o = (t(b, "attn_output") / t(a, "attn_output"))[0]
        all_s += [s_attn, s_ffn, s_down]
        if mha:
            all_s.append(s_o)
        elif not np.array_equal(t(a, "attn_output"), t(b, "attn_output")):
            failures.append("layer %d: attn_output changed with grouped K/V heads" % i)
        want = {
            "attn_q": s_attn[None, :], "attn_k": s_attn[None, :],
            "attn_v": s_attn[None, :] / (s_o[:, None] if mha else 1.0),
            "attn_output": np.broadcast_to(s_o[None, :], t(a, "attn_output").shape),
            "ffn_gate": s_ffn[None, :], "ffn_up": s_ffn[None, :] / s_down[:, None],
            "ffn_down": np.broadcast_to(s_down[None, :], t(a, "ffn_down").shape),
        }
        for name, w in want.items():
            ratio_check("blk.%d.%s" % (i, name), t(b, name) / t(a, name), w)
    s = np.concatenate(all_s)
    if s.min() > 0.6 or s.max() < 1.6:
        failures.append("scales %g..%g: folding did not happen" % (s.min(), s.max()))


def one_model(tmp, arch, extra, mha=False):
    tag = arch + ("_mha" if mha else "")
    src, out = os.path.join(tmp, tag + ".gguf"), os.path.join(tmp, tag + "_fold.gguf")
    run([sys.executable, MKGGUF, src, "--arch", arch, "--type", "f32", "--layers", "2",
         "--seed", "3", "-q"] + extra)
    p = run([LOOM, "quantize", src, out, "f32", "--strategy", FOLD, "-t", "2"])
    a, b = tensors(src), tensors(out)
    check_scales(a, b, 2, mha)
    if not np.array_equal(a["token_embd.weight"], b["token_embd.weight"]):
        failures.append("%s: token_embd changed" % arch)
    la, ta = logits_and_tokens(src, tmp, tag + "_a")
    lb, tb = logits_and_tokens(out, tmp, tag + "_b")
    rel = float(np.max(np.abs(la - lb)) / np.max(np.abs(la)))
    print("%s: logits after folding differ by %.2e of max|logit| (tolerance %g)" % (tag, rel, TOL))
    if not rel < TOL:
        failures.append("%s: folded logits differ by %.3g relative" % (tag, rel))
    if ta != tb:
        failures.append("%s: greedy tokens differ: %s vs %s" % (tag, ta, tb))


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
        one_model(tmp, "llama", ["--kv-heads", "4"], mha=True)
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
