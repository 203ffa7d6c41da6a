#!/usr/bin/env python3
"""The importance-weighted search (the format plugins' from_float_weighted,
through `loom quantize --strategy imatrix`) against round to nearest, for
every integer format, on random matrices with skewed rows and outliers and
a skewed (log-normal) importance per input column:

  - the weighted error sum_j imp_j (w - w_hat)^2 of the imatrix strategy's
    tensor is below rtn's (by at least MIN_GAIN for every format) and, as
    the plugin ABI promises, no block is worse than rtn's block;
  - a tensor the imatrix has no entry for gets the search with equal
    weights: its plain squared error is no worse than rtn's;
  - the strategy refuses to run without --imatrix, naming the flag.
Tensors are dequantized with the gguf package (gguf.quants.dequantize).
Usage: test_weighted.py LOOM_EXE
"""
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import gguf
    from gguf import quants
except ImportError as e:
    print("SKIP: needs numpy and gguf (scripts/setup.sh --test): %s" % e)
    sys.exit(77)

LOOM = sys.argv[1]
TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K"]
BLOCK = {"q2_K": 256, "q3_K": 256, "q4_K": 256, "q5_K": 256, "q6_K": 256}
ROWS, COLS = 24, 512
MIN_GAIN = 0.02  # the weighted error at least 2 % below rtn's
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def make_source(path, rng):
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    data = {}
    for name in ["blk.0.attn_q.weight", "blk.0.ffn_up.weight"]:
        x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
        x *= rng.uniform(0.01, 3.0, size=(ROWS, 1)).astype(np.float32)
        x.flat[rng.integers(0, x.size, size=6)] *= 15  # outliers
        data[name] = x
        w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return data


def write_imatrix(path, name, imp):
    with open(path, "wb") as f:
        f.write(struct.pack("<i", 1))
        f.write(struct.pack("<i", len(name)) + name.encode())
        f.write(struct.pack("<ii", 1, imp.size) + imp.astype(np.float32).tobytes())
        f.write(struct.pack("<ii", 1, 4) + b"test")


def dequantized(path):
    r = gguf.GGUFReader(path)
    out = {}
    for t in r.tensors:
        out[t.name] = quants.dequantize(t.data, t.tensor_type).reshape(ROWS, COLS).astype(np.float64)
    return out


def quantize(src, out, typ, *extra):
    p = subprocess.run([LOOM, "quantize", src, out, typ, "-t", "2", "--force"] + list(extra),
                       capture_output=True, text=True, timeout=120)
    if p.returncode:
        sys.exit("FAIL: loom quantize %s %s\n%s" % (typ, " ".join(extra), p.stderr))


def main():
    rng = np.random.default_rng(2)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src.gguf")
        data = make_source(src, rng)
        imp = np.exp(2.0 * rng.standard_normal(COLS))  # skewed activations
        im = os.path.join(tmp, "imatrix.dat")
        write_imatrix(im, "blk.0.attn_q.weight", imp)
        p = subprocess.run([LOOM, "quantize", src, os.path.join(tmp, "x.gguf"), "q4_0",
                            "--strategy", "imatrix"], capture_output=True, text=True)
        check(p.returncode == 1 and "--imatrix" in p.stderr,
              "imatrix strategy without --imatrix refused (%s)" % p.stderr.strip())
        for typ in TYPES:
            a, b = os.path.join(tmp, "rtn.gguf"), os.path.join(tmp, "imat.gguf")
            quantize(src, a, typ)
            quantize(src, b, typ, "--strategy", "imatrix", "--imatrix", im)
            ra, rb = dequantized(a), dequantized(b)
            x = data["blk.0.attn_q.weight"].astype(np.float64)
            ea = (x - ra["blk.0.attn_q.weight"]) ** 2 * imp
            eb = (x - rb["blk.0.attn_q.weight"]) ** 2 * imp
            blk = BLOCK.get(typ, 32)
            ba = ea.reshape(-1, blk).sum(axis=1)
            bb = eb.reshape(-1, blk).sum(axis=1)
            worse = int(np.sum(bb > ba * (1 + 1e-4) + 1e-12))
            ratio = bb.sum() / ba.sum()
            check(ratio < 1 - MIN_GAIN and worse == 0,
                  "%s: weighted error %.3f of rtn's, %d of %d blocks worse" %
                  (typ, ratio, worse, ba.size))
            y = data["blk.0.ffn_up.weight"].astype(np.float64)
            ma = np.sum((y - ra["blk.0.ffn_up.weight"]) ** 2)
            mb = np.sum((y - rb["blk.0.ffn_up.weight"]) ** 2)
            check(mb <= ma * (1 + 1e-6),
                  "%s: no imatrix entry: squared error %.3f of rtn's" % (typ, mb / ma))
    if failures:
        sys.exit("FAILED: %d checks" % len(failures))
    print("all passed")


if __name__ == "__main__":
    main()
