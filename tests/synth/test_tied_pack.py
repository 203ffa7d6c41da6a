#!/usr/bin/env python3
"""A tied token table packed for both embed and the output head (ABI 1.5).

cpu.so packs a tied Q5_0 / Q5_1 table once and reads that copy for embed
(unpacking the rows it needs) and for the output GEMM, and a Q8_0 or K-quant
(Q2_K .. Q6_K) one in its 16-row groups (kpack.h; the K-quant models quantized by
loom quantize from f16, 256 wide so that rows hold whole super-blocks). For random tied
llamas in those formats this checks that loom's fast mode gives the same
logits, bit for bit, with packing on and off (LOOM_CPU_PACK=0): the
perplexity run's every position (embed of each prompt token, the head on
each row) and a greedy run's tokens. It also checks from the load line
that the table was packed (one more packed tensor than the layers have).

Usage: test_tied_pack.py LOOM_BINARY MKGGUF_PY
"""
import os
import re
import subprocess
import sys
import tempfile

TEXT = "/usr/share/common-licenses/GPL-3"
LAYERS = 2
PER_LAYER = 7  # q, k, v, o, gate, up, down
CASES = ("q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K")


def run(cmd, env):
    # bytes: a random model's text need not be UTF-8
    p = subprocess.run(cmd, env=env, capture_output=True, timeout=300)
    err = p.stderr.decode("utf-8", "replace")
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (cmd[1], p.returncode, err[-800:]))
    return p.stdout, err


def packed_count(stderr):
    m = re.search(r"in (\d+) tensors packed", stderr)
    return int(m.group(1)) if m else 0


def main():
    if len(sys.argv) != 3:
        print("usage: test_tied_pack.py LOOM_BINARY MKGGUF_PY")
        return 2
    loom, mkgguf = sys.argv[1], sys.argv[2]
    if not os.path.isfile(TEXT):
        print("skip: %s missing" % TEXT)
        return 77
    try:
        import gguf  # noqa: F401
    except ImportError as e:
        print("skip: python module missing: %s" % e)
        return 77
    fails = []
    base = dict(os.environ, LOOM_DEBUG="1")
    base.pop("LOOM_CPU_EXACT", None)
    base.pop("LOOM_CPU_PACK", None)
    with tempfile.TemporaryDirectory(prefix="loom-tied-pack-") as tmp:
        for seed, qtype in enumerate(CASES):
            model = os.path.join(tmp, "tied-%s.gguf" % qtype)
            kquant = qtype.endswith("_K")
            made = os.path.join(tmp, "tied-f16.gguf") if kquant else model
            run([sys.executable, mkgguf, made, "-q", "--seed", str(seed + 11),
                 "--layers", str(LAYERS), "--embd", "256" if kquant else "128",
                 "--ff", "512" if kquant else "256",
                 "--heads", "4", "--kv-heads", "2", "--vocab", "512",
                 "--ctx", "256", "--type", "f16" if kquant else qtype, "--tied"], base)
            if kquant:
                run([loom, "quantize", made, model, qtype], base)
            got = {}
            for pack in ("1", "0"):
                env = dict(base, LOOM_CPU_PACK=pack)
                logits = os.path.join(tmp, "ppl-%s-%s.f32" % (qtype, pack))
                _, err = run([loom, "perplexity", "--model", model, "-f", TEXT,
                              "-c", "64", "--chunks", "3", "-t", "2",
                              "--save-logits", logits], env)
                n = packed_count(err)
                toks, _ = run([loom, "run", "--model", model, "-p",
                               "the quick brown fox", "-n", "24", "--temp", "0",
                               "-t", "2", "--no-progress"], env)
                with open(logits, "rb") as f:
                    got[pack] = (f.read(), toks, n)
            want_n = LAYERS * PER_LAYER + 1  # the table too
            if got["1"][2] != want_n:
                fails.append("%s: %d tensors packed, expected %d" %
                             (qtype, got["1"][2], want_n))
            if got["0"][2] != 0:
                fails.append("%s: LOOM_CPU_PACK=0 still packed %d" % (qtype, got["0"][2]))
            if not got["1"][0] or got["1"][0] != got["0"][0]:
                fails.append("%s: perplexity logits differ with packing (%d vs %d bytes)" %
                             (qtype, len(got["1"][0]), len(got["0"][0])))
            if got["1"][1] != got["0"][1]:
                fails.append("%s: greedy text differs with packing" % qtype)
            print("%s: %d tensors packed, %d bytes of logits equal: %s" %
                  (qtype, got["1"][2], len(got["1"][0]), got["1"][0] == got["0"][0]))
    for f in fails:
        print("FAIL: " + f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
