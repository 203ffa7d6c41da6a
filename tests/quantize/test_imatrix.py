#!/usr/bin/env python3
"""Importance-matrix files and `loom imatrix` (docs/QUANTIZATION.md):

  - a file in llama.cpp's legacy layout written here is read back by
    `loom imatrix --show` with each mean = value / ncall, the chunk count
    and the dataset name; a llama.cpp GGUF imatrix (in_sum2 / counts,
    written with the gguf package) likewise;
  - truncated and corrupt files (every cut of a small file, a huge entry
    count, a name length out of range, a negative size, junk after the
    trailer, a GGUF of another general.type) are refused with a message
    naming the file and the problem, never a crash;
  - `loom quantize --imatrix` with rtn writes the same bytes as without
    (rtn uses none), and an imatrix of another width is refused naming
    the tensor;
  - with the model (LOOM_MODEL): `loom imatrix` over 2 chunks of 16 tokens
    writes 7 entries a layer (output left out) with ncall 2; with
    --hessian the same means, and per weight a symmetric Hessian whose
    diagonal is the mean of x^2, 32 tokens, attn_q/k/v and ffn_gate/up
    sharing one matrix;
  - where llama.cpp is built (LLAMA_CPP_BIN), llama-quantize --imatrix
    reads a file of loom imatrix --hessian on a random 2-layer llama and
    loads its 14 entries over 2 chunks.
Usage: test_imatrix.py LOOM_EXE
"""
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import gguf
except ImportError as e:
    print("SKIP: needs numpy and gguf (scripts/setup.sh --test): %s" % e)
    sys.exit(77)

LOOM = sys.argv[1]
MODEL = os.environ.get("LOOM_MODEL", "")
TEXT = "/usr/share/common-licenses/GPL-3"
MKGGUF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "mkgguf.py")
LLAMA_BIN = os.environ.get("LLAMA_CPP_BIN", os.path.expanduser(
    "~/.cache/loom/llama.cpp-0.3.36/build/bin"))
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(*args):
    return subprocess.run([LOOM] + list(args), capture_output=True, text=True, timeout=300)


def legacy_bytes(entries, chunks=None, dataset=b""):
    """entries: (name, ncall, values)."""
    out = struct.pack("<i", len(entries))
    for name, ncall, v in entries:
        out += struct.pack("<i", len(name)) + name.encode()
        out += struct.pack("<ii", ncall, len(v)) + np.asarray(v, np.float32).tobytes()
    if chunks is not None:
        out += struct.pack("<ii", chunks, len(dataset)) + dataset
    return out


def show(path):
    """--show's entries: name -> (cols, tokens, mean, max)."""
    p = run("imatrix", "--show", path)
    if p.returncode:
        return None, p.stderr
    lines = p.stdout.splitlines()
    ent = {}
    for ln in lines[1:]:
        f = ln.split()
        ent[f[0]] = (int(f[2]), int(f[4]), float(f[6]), float(f[8]))
    return ent, lines[0]


def test_legacy(tmp, rng):
    a = rng.uniform(0, 4, 64).astype(np.float32)
    b = rng.uniform(0, 1, 32).astype(np.float32)
    path = os.path.join(tmp, "legacy.dat")
    with open(path, "wb") as f:
        f.write(legacy_bytes([("blk.0.attn_q.weight", 4, a), ("blk.0.ffn_down.weight", 1, b)],
                             10, b"wiki.train.raw"))
    ent, head = show(path)
    check(ent is not None and "2 entries, 10 chunks, dataset 'wiki.train.raw'" in head,
          "legacy file: header read (%s)" % head)
    if ent:
        q = ent.get("blk.0.attn_q.weight")
        check(q and q[0] == 64 and abs(q[2] - float(np.mean(a / 4))) < 1e-5 * max(1, q[2]) and
              abs(q[3] - float(np.max(a / 4))) < 1e-6 * max(1, q[3]),
              "legacy file: values divided by ncall (%s)" % (q,))
        d = ent.get("blk.0.ffn_down.weight")
        check(d and d[0] == 32 and abs(d[2] - float(np.mean(b))) < 1e-6,
              "legacy file: second entry")
    # without the optional trailer (older llama.cpp files)
    with open(path, "wb") as f:
        f.write(legacy_bytes([("x.weight", 2, a)]))
    ent, head = show(path)
    check(ent is not None and "1 entries, 0 chunks" in head, "legacy file without trailer read")


def test_token_counts(tmp, rng):
    """loom's LOOMTOK1 section: read into --show's tokens, checked."""
    a = rng.uniform(0, 1, 8).astype(np.float32)
    good = legacy_bytes([("x.weight", 2, a), ("y.weight", 2, a)], 2, b"calib.txt")
    path = os.path.join(tmp, "tok.dat")
    with open(path, "wb") as f:
        f.write(good + b"LOOMTOK1" + struct.pack("<IQQ", 2, 40, 7))
    ent, _ = show(path)
    check(ent is not None and ent["x.weight"][1] == 40 and ent["y.weight"][1] == 7,
          "LOOMTOK1: each entry's token count shown (%s)" % (ent,))
    with open(path, "wb") as f:
        f.write(good + b"LOOMTOK1" + struct.pack("<IQ", 1, 40))
    expect_refused(path, ["1 token counts for 2 entries"], "a token section of the wrong count")
    with open(path, "wb") as f:
        f.write(good + b"LOOMTOK1" + struct.pack("<IQ", 2, 40))
    expect_refused(path, ["truncated"], "a cut token section")


def expect_refused(path, words, what):
    p = run("imatrix", "--show", path)
    ok = p.returncode == 1 and path in p.stderr and all(w in p.stderr for w in words)
    check(ok, "%s refused naming the problem (%s)" % (what, p.stderr.strip()[:160]))


def test_corrupt(tmp, rng):
    good = legacy_bytes([("blk.0.attn_q.weight", 2, rng.uniform(0, 1, 8)),
                         ("blk.0.attn_k.weight", 2, rng.uniform(0, 1, 8))], 2, b"calib.txt")
    path = os.path.join(tmp, "bad.dat")
    crashed = []
    for cut in range(1, len(good)):
        with open(path, "wb") as f:
            f.write(good[:cut])
        p = run("imatrix", "--show", path)
        # a cut inside the optional trailer's dataset name still fails; a
        # cut right after the entries is a valid trailer-less file
        if p.returncode not in (0, 1) or (p.returncode == 1 and path not in p.stderr):
            crashed.append((cut, p.returncode, p.stderr[-200:]))
    check(not crashed, "every truncation of a file: clean exit or error naming it %s" % crashed[:2])
    with open(path, "wb") as f:
        f.write(good[:60])
    expect_refused(path, ["truncated"], "a file cut inside an entry")
    with open(path, "wb") as f:
        f.write(struct.pack("<i", 1 << 30) + good[4:])
    expect_refused(path, ["entries"], "a huge entry count")
    with open(path, "wb") as f:
        f.write(struct.pack("<ii", 1, 100000) + good[8:])
    expect_refused(path, ["length"], "a name length out of range")
    bad = bytearray(good)
    struct.pack_into("<i", bad, 4 + 4 + 19 + 4, -5)
    with open(path, "wb") as f:
        f.write(bad)
    expect_refused(path, ["-5 values"], "a negative size")
    with open(path, "wb") as f:
        f.write(good + b"junkjunkjunk")
    expect_refused(path, ["Hessian section"], "junk after the trailer")
    bad = bytearray(good)
    struct.pack_into("<f", bad, 4 + 4 + 19 + 8, float("nan"))
    with open(path, "wb") as f:
        f.write(bad)
    expect_refused(path, ["nan"], "a NaN value")
    gpath = os.path.join(tmp, "model.gguf")
    w = gguf.GGUFWriter(gpath, "llama")
    w.add_tensor("blk.0.attn_q.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    expect_refused(gpath, ["general.type", "not 'imatrix'"], "a model GGUF")
    expect_refused(os.path.join(tmp, "missing.dat"), ["No such file"], "a missing file")


def test_gguf(tmp, rng):
    path = os.path.join(tmp, "imatrix.gguf")
    s = rng.uniform(0, 50, 48).astype(np.float32)
    e = rng.uniform(0, 10, (3, 16)).astype(np.float32)  # 3 experts
    w = gguf.GGUFWriter(path, "llama")
    w.add_string("general.type", "imatrix")
    w.add_uint32("imatrix.chunk_count", 7)
    w.add_uint32("imatrix.chunk_size", 512)
    w.add_array("imatrix.datasets", ["calib.txt"])
    w.add_tensor("blk.0.attn_q.weight.in_sum2", s.reshape(1, 48))
    w.add_tensor("blk.0.attn_q.weight.counts", np.array([[10.0]], np.float32))
    w.add_tensor("blk.0.ffn_up_exps.weight.in_sum2", e)
    w.add_tensor("blk.0.ffn_up_exps.weight.counts", np.array([[2.0], [0.0], [4.0]], np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ent, head = show(path)
    check(ent is not None and "2 entries, 7 chunks, dataset 'calib.txt'" in head,
          "GGUF imatrix: header read (%s)" % head)
    if ent:
        q = ent.get("blk.0.attn_q.weight")
        check(q and q[0] == 48 and q[1] == 10 and abs(q[2] - float(np.mean(s / 10))) < 1e-5,
              "GGUF imatrix: in_sum2 / counts (%s)" % (q,))
        x = ent.get("blk.0.ffn_up_exps.weight")
        want = np.concatenate([e[0] / 2, np.ones(16), e[2] / 4])
        check(x and x[0] == 48 and abs(x[2] - float(np.mean(want))) < 1e-5,
              "GGUF imatrix: experts one after another, a zero count gives 1s (%s)" % (x,))


def small_model(path, rng):
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    for name, shape in {"blk.0.attn_q.weight": (8, 64), "blk.0.ffn_down.weight": (4, 96)}.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_quantize(tmp, rng):
    src = os.path.join(tmp, "src.gguf")
    small_model(src, rng)
    im = os.path.join(tmp, "small.dat")
    with open(im, "wb") as f:
        f.write(legacy_bytes([("blk.0.attn_q.weight", 1, rng.uniform(0, 1, 64))], 1, b"x"))
    a, b = os.path.join(tmp, "a.gguf"), os.path.join(tmp, "b.gguf")
    p1 = run("quantize", src, a, "q4_0")
    p2 = run("quantize", src, b, "q4_0", "--imatrix", im)
    same = p1.returncode == 0 and p2.returncode == 0 and open(a, "rb").read() == open(b, "rb").read()
    check(same, "quantize rtn with --imatrix: the bytes of rtn without (%s)" % p2.stderr.strip())
    with open(im, "wb") as f:
        f.write(legacy_bytes([("blk.0.ffn_down.weight", 1, rng.uniform(0, 1, 64))], 1, b"x"))
    p = run("quantize", src, b, "q4_0", "--imatrix", im, "--force")
    check(p.returncode == 1 and "blk.0.ffn_down.weight" in p.stderr and "another model" in p.stderr,
          "an imatrix entry of another width refused naming the tensor (%s)" % p.stderr.strip())
    p = run("quantize", src, b, "q4_0", "--imatrix", os.path.join(tmp, "none.dat"), "--force")
    check(p.returncode == 1 and "none.dat" in p.stderr, "a missing --imatrix file refused")


def gguf_of(path, tensors):
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_inconsistent(tmp, rng):
    """Inputs that do not fit together are refused by name."""
    src = os.path.join(tmp, "src2.gguf")
    small_model(src, rng)
    out = os.path.join(tmp, "inc.gguf")
    im = os.path.join(tmp, "other.dat")
    with open(im, "wb") as f:
        f.write(legacy_bytes([("blk.7.attn_k.weight", 1, rng.uniform(0, 1, 64))], 1, b"x"))
    p = run("quantize", src, out, "q4_0", "--strategy", "imatrix", "--imatrix", im)
    check(p.returncode == 1 and "no entry for any of the 2 tensors" in p.stderr
          and "blk.7.attn_k.weight" in p.stderr and not os.path.exists(out),
          "an imatrix matching no tensor refused, not 'quantized by imatrix' (%s)" % p.stderr.strip())
    with open(im, "wb") as f:
        f.write(legacy_bytes([("blk.0.attn_q.weight", 1, rng.uniform(0, 1, 64))], 1, b"x"))
    p = run("quantize", src, out, "q4_0", "--strategy", "imatrix", "--imatrix", im)
    check(p.returncode == 0 and "2 quantized by imatrix, 1 of them with imatrix data" in p.stdout,
          "the summary counts the tensors with imatrix data (%s)" % (p.stdout + p.stderr).strip())

    dup = os.path.join(tmp, "dup.dat")
    with open(dup, "wb") as f:
        f.write(legacy_bytes([("blk.0.attn_q.weight", 1, rng.uniform(0, 1, 64)),
                              ("blk.0.attn_q.weight", 1, rng.uniform(0, 1, 32))], 1, b"x"))
    p = run("imatrix", "--show", dup)
    check(p.returncode == 1 and "'blk.0.attn_q.weight' has two entries" in p.stderr
          and ("(64 and 32 columns)" in p.stderr or "(32 and 64 columns)" in p.stderr),
          "duplicate imatrix entries refused naming the tensor (%s)" % p.stderr.strip())
    p = run("quantize", src, os.path.join(tmp, "dup.gguf"), "q4_0", "--imatrix", dup)
    check(p.returncode == 1 and "two entries" in p.stderr, "quantize refuses it too (%s)" % p.stderr.strip())

    empty = os.path.join(tmp, "empty.gguf")
    gguf_of(empty, {})
    p = run("quantize", empty, out + ".e", "q4_0")
    check(p.returncode == 1 and "no tensors" in p.stderr and not os.path.exists(out + ".e"),
          "a GGUF without tensors: refused, nothing written (%s)" % p.stderr.strip())

    zero = os.path.join(tmp, "zero.gguf")
    gguf_of(zero, {"blk.0.attn_q.weight": np.zeros((0, 64), np.float32)})
    p = run("info", zero)
    check(p.returncode == 1 and "blk.0.attn_q.weight" in p.stderr and "ne[1] is 0" in p.stderr,
          "a zero dimension refused by info (%s)" % p.stderr.strip())
    p = run("quantize", zero, out + ".z", "q4_0")
    check(p.returncode == 1 and "ne[1] is 0" in p.stderr and zero in p.stderr,
          "a zero dimension refused by quantize, not 'out of memory' (%s)" % p.stderr.strip())


def parse_file(path):
    """The legacy entries (name -> (ncall, values)) and loom's Hessians
    (name -> (tokens, offset or shared index))."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    buf = memoryview(data)
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return v

    n, = take("<i")
    ent = {}
    for _ in range(n):
        ln, = take("<i")
        name = bytes(buf[pos:pos + ln]).decode()
        pos += ln
        ncall, nval = take("<ii")
        ent[name] = (ncall, np.frombuffer(buf, np.float32, nval, pos))
        pos += 4 * nval
    chunks, ln = take("<ii")
    pos += ln
    tokens = {}
    if bytes(buf[pos:pos + 8]) == b"LOOMTOK1":
        pos += 8
        nt, = take("<I")
        assert nt == n
        for name in list(ent):
            tokens[name], = take("<Q")
    hes = {}
    if pos < len(buf):
        magic = bytes(buf[pos:pos + 8])
        pos += 8
        version, nh = take("<II")
        order = []
        for _ in range(nh):
            ln, = take("<I")
            name = bytes(buf[pos:pos + ln]).decode()
            pos += ln
            cols, same, tokens, off = take("<IIQQ")
            order.append(name)
            hes[name] = (cols, same, tokens, off)
        index = dict(hes)
        for name, (cols, same, tokens, off) in index.items():
            src = index[order[same]] if same != 0xffffffff else index[name]
            mat = np.frombuffer(buf, np.float32, cols * cols, src[3]).reshape(cols, cols)
            hes[name] = (tokens, same, mat)
        assert magic == b"LOOMHES1" and version == 1
    return chunks, ent, hes, tokens


def test_model(tmp):
    if not os.path.exists(MODEL):
        print("skip: the model part (no LOOM_MODEL)")
        return
    a, h = os.path.join(tmp, "a.dat"), os.path.join(tmp, "h.dat")
    base = ["imatrix", "-m", MODEL, "-f", TEXT, "-c", "16", "--chunks", "2", "-t", "2"]
    p = run(*base, "-o", a)
    check(p.returncode == 0, "loom imatrix runs (%s)" % p.stderr.strip()[-300:])
    if p.returncode:
        return
    chunks, ent, hes, tokens = parse_file(a)
    n_layer = len({k.split(".")[1] for k in ent if k.startswith("blk.")})
    check(chunks == 2 and len(ent) == 7 * n_layer and not hes and
          all(v[0] == 2 for v in ent.values()) and "output.weight" not in ent,
          "imatrix file: 7 weights a layer of %d, ncall 2, no output matrix" % n_layer)
    check(set(tokens) == set(ent) and all(t == 32 for t in tokens.values()),
          "the file counts 32 tokens (2 chunks of 16) behind every entry")
    shown, _ = show(a)
    check(shown is not None and set(shown) == set(ent) and
          all(v[1] == 32 for v in shown.values()),
          "--show prints the real token counts, 32, not 0: %s" %
          (sorted({v[1] for v in shown.values()}) if shown else None))
    q = ent["blk.0.attn_q.weight"][1]
    check(q.size == 576 and np.all(q >= 0) and np.all(np.isfinite(q)) and q.max() > 0,
          "imatrix values: 576 finite non-negative (max %.4g)" % q.max())
    check(np.array_equal(ent["blk.3.attn_q.weight"][1], ent["blk.3.attn_v.weight"][1]),
          "attn_q and attn_v see the same input")
    p = run(*base, "-o", h, "--hessian")
    check(p.returncode == 0, "loom imatrix --hessian runs (%s)" % p.stderr.strip()[-300:])
    if p.returncode:
        return
    chunks2, ent2, hes, tokens2 = parse_file(h)
    check(all(np.array_equal(ent[k][1], ent2[k][1]) for k in ent),
          "--hessian: the same means, bit for bit")
    check(set(hes) == set(ent) and all(v[0] == 32 for v in hes.values()),
          "a Hessian per weight, over 32 tokens")
    worst = 0.0
    for name in ["blk.0.attn_q.weight", "blk.0.attn_output.weight", "blk.15.ffn_down.weight",
                 "blk.29.ffn_up.weight"]:
        if name not in hes:
            continue
        m, mean = hes[name][2], ent2[name][1] / 2
        diag = np.diag(m).astype(np.float64)
        worst = max(worst, float(np.max(np.abs(diag - mean) / (np.abs(mean) + 1e-6))))
        check(np.array_equal(m, m.T), "%s: the Hessian is symmetric" % name)
    check(worst < 1e-4, "Hessian diagonal = mean of x^2 (worst relative difference %.2g)" % worst)
    check(hes["blk.2.attn_k.weight"][1] != 0xffffffff and hes["blk.2.ffn_up.weight"][1] != 0xffffffff
          and hes["blk.2.attn_q.weight"][1] == 0xffffffff,
          "attn_k shares attn_q's matrix, ffn_up ffn_gate's")
    ent3, head = show(h)
    check(ent3 is not None and "Hessians" in head and ent3["blk.0.attn_q.weight"][1] == 32,
          "--show reads the Hessian section")


def test_llama_reads(tmp):
    """llama-quantize (where built) reads loom's file, Hessian section and
    all, with every entry."""
    quant = os.path.join(LLAMA_BIN, "llama-quantize")
    if not os.access(quant, os.X_OK):
        print("skip: llama-quantize not built (%s)" % LLAMA_BIN)
        return
    src, dat = os.path.join(tmp, "tiny.gguf"), os.path.join(tmp, "tiny.dat")
    subprocess.run([sys.executable, MKGGUF, src, "--layers", "2", "--type", "f32"],
                   check=True, capture_output=True)
    p = run("imatrix", "-m", src, "-f", TEXT, "-o", dat, "-c", "32", "--chunks", "2",
            "--hessian")
    check(p.returncode == 0, "loom imatrix on a random llama (%s)" % p.stderr.strip()[-200:])
    q = subprocess.run([quant, "--imatrix", dat, src, os.path.join(tmp, "tiny_q.gguf"), "Q4_0"],
                       capture_output=True, text=True, timeout=120)
    out = q.stdout + q.stderr
    check(q.returncode == 0 and "loaded 14 importance matrix entries" in out and
          "computed on 2 chunks" in out,
          "llama-quantize reads loom's imatrix with its Hessian section (%s)" %
          (out.strip()[-300:] if q.returncode else "loaded"))


def main():
    rng = np.random.default_rng(15)
    with tempfile.TemporaryDirectory() as tmp:
        test_legacy(tmp, rng)
        test_corrupt(tmp, rng)
        test_token_counts(tmp, rng)
        test_gguf(tmp, rng)
        test_quantize(tmp, rng)
        test_inconsistent(tmp, rng)
        test_model(tmp)
        test_llama_reads(tmp)
    if failures:
        sys.exit("FAILED: %d checks" % len(failures))
    print("all passed")


if __name__ == "__main__":
    main()
