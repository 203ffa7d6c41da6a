#!/usr/bin/env python3
"""`loom quantize` on small random GGUF files, against the gguf package.

  - rtn's bytes equal gguf.quants.quantize for every format it has (q4_0,
    q4_1, q5_0, q5_1, q8_0, bf16, f16; f32 is the source itself);
  - k-quants (no quantizer in gguf) dequantize (gguf.quants.dequantize)
    within twice the RMS error of an ideal uniform rounding of each
    sub-block (NumPy below);
  - the output loads in gguf.GGUFReader with every key of the input kept
    and general.file_type set to llama.cpp's number for the type;
  - 1-D tensors stay f32; rows that do not divide into 256 fall back to a
    32-block format, rows that do not divide into 32 to f16;
  - a quantized source is refused without --allow-requantize, and with it
    is dequantized first; -t 1 and -t 3 write the same bytes;
  - --dry-run writes nothing and its totals equal the written file's;
  - errors name what is wrong: missing input, unknown type, unknown or
    broken strategy (by flag and by config key).
  - broken strategy plugins are refused with the reason, one line each:
    another ABI major, no quantize slot, no name, an unknown needs flag; a
    strategy that fails names the tensor and its message; one that needs
    an importance matrix is refused when none is given.
Usage: test_quantize.py LOOM_EXE [qs_*.so ...] (the broken strategies)
"""
import os
import re
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf import quants
except ImportError as e:
    print("SKIP: needs numpy and gguf (scripts/setup.sh --test): %s" % e)
    sys.exit(77)

LOOM = sys.argv[1]
BAD = {os.path.basename(p)[3:-3]: p for p in sys.argv[2:]}
BAD_WANT = {
    "bad_major": "ABI major 2, this loom needs 1",
    "no_quantize": "required slot quantize is missing",
    "no_name": "descriptor has no name",
    "unknown_need": "needs flags 0x80 unknown",
    "fails": "tensor 'output.weight': strategy failed: refusing output.weight on purpose",
    "needs_imatrix": "needs calibration data",
}
failures = []

# llama.cpp's llama_ftype numbers (general.file_type) for the plain types
FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8,
             "q5_1": 9, "q2_K": 10, "q3_K": 11, "q4_K": 14, "q5_K": 16,
             "q6_K": 18, "bf16": 32}
GGML = {"f32": T.F32, "f16": T.F16, "bf16": T.BF16, "q4_0": T.Q4_0,
        "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q5_1": T.Q5_1, "q8_0": T.Q8_0,
        "q2_K": T.Q2_K, "q3_K": T.Q3_K, "q4_K": T.Q4_K, "q5_K": T.Q5_K,
        "q6_K": T.Q6_K}
REFERENCE = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "bf16", "f16"]
# k-quants: bits, sub-block size, whether the sub-block has a min
KQUANT = {"q2_K": (2, 16, True), "q3_K": (3, 16, False), "q4_K": (4, 32, True),
          "q5_K": (5, 32, True), "q6_K": (6, 16, False)}

# name -> numpy shape (rows, cols); GGUF stores ne = (cols, rows)
SHAPES = {
    "token_embd.weight": (24, 256),
    "blk.0.attn_norm.weight": (256,),
    "blk.0.attn_q.weight": (16, 256),
    "blk.0.attn_k.weight": (8, 96),   # not a multiple of 256
    "blk.0.attn_v.weight": (8, 40),   # not a multiple of 32
    "blk.0.ffn_down.weight": (12, 512),
    "output.weight": (24, 256),
}


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def loom(*args, ok=True):
    p = subprocess.run([LOOM, "quantize"] + list(args), capture_output=True, text=True,
                       timeout=120)
    if ok and p.returncode != 0:
        sys.exit("FAIL: loom quantize %s\n%s" % (" ".join(args), p.stderr))
    return p


def make_source(path, rng):
    """A llama-like GGUF of f32 tensors with skewed rows and outliers."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_string("test.note", "kept as is")
    w.add_float32("test.float", 0.25)
    w.add_array("test.ints", [3, 1, 4, 1, 5])
    w.add_array("test.strings", ["a", "bc", ""])
    data = {}
    for name, shape in SHAPES.items():
        x = rng.standard_normal(shape).astype(np.float32)
        if len(shape) == 2:
            x *= rng.uniform(0.01, 3.0, size=(shape[0], 1)).astype(np.float32)
            x.flat[rng.integers(0, x.size, size=3)] *= 20  # outliers
        data[name] = x
        w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return data


def expected_type(name, t):
    shape = SHAPES[name]
    if len(shape) == 1:
        return "f32"
    cols = shape[1]
    if t in KQUANT and cols % 256:
        t = {"q2_K": "q4_0", "q3_K": "q4_0", "q4_K": "q5_0", "q5_K": "q5_1",
             "q6_K": "q8_0"}[t]
    if t not in ("f32", "f16", "bf16") and cols % 32:
        t = "f16"
    return t


def ideal_rms(x, bits, sub, has_min):
    """RMS error of rounding each sub-block uniformly to 2^bits levels with
    an exact (unquantized) scale: step^2 / 12 per element."""
    b = x.reshape(-1, sub).astype(np.float64)
    if has_min:
        step = (b.max(1) - b.min(1)) / (2 ** bits - 1)
    else:
        step = 2 * np.abs(b).max(1) / (2 ** bits - 1)
    return np.sqrt(np.mean(step ** 2 / 12))


def tensor_map(reader):
    return {t.name: t for t in reader.tensors}


def field_value(reader, key):
    f = reader.fields[key]
    return [bytes(f.parts[i]) for i in f.data]


def check_file(path, src_path, data, t):
    r = gguf.GGUFReader(path)
    s = gguf.GGUFReader(src_path)
    ft = r.fields.get("general.file_type")
    check(ft is not None and int(ft.parts[-1][0]) == FILE_TYPE[t],
          "%s: general.file_type %d" % (t, FILE_TYPE[t]))
    kept = [k for k in s.fields if not k.startswith("GGUF.") and k != "general.file_type"]
    check(all(k in r.fields and field_value(r, k) == field_value(s, k) for k in kept),
          "%s: all %d keys of the input kept with their values" % (t, len(kept)))
    tm = tensor_map(r)
    for name, x in data.items():
        want = expected_type(name, t)
        got = tm[name].tensor_type
        if got != GGML[want]:
            check(False, "%s: %s is %s, expected %s" % (t, name, got.name, want))
            continue
        raw = np.asarray(tm[name].data)
        y = quants.dequantize(raw, got).reshape(x.shape)
        if want == "f32":
            check(np.array_equal(y, x), "%s: %s (f32) copied exactly" % (t, name))
        elif want in REFERENCE:
            ref = quants.quantize(x, GGML[want])
            check(raw.tobytes() == np.asarray(ref).tobytes(),
                  "%s: %s (%s) bytes equal gguf.quants.quantize" % (t, name, want))
        else:
            bits, sub, has_min = KQUANT[want]
            err = np.sqrt(np.mean((y.astype(np.float64) - x) ** 2))
            bound = 2 * ideal_rms(x, bits, sub, has_min)
            check(err <= bound, "%s: %s (%s) RMS error %.4g <= %.4g" % (t, name, want,
                                                                         err, bound))


def plan_totals(out):
    m = re.search(r"tensor data (\d+) bytes .*; file (\d+) bytes", out)
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def data_bytes(path):
    return sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors)


def main():
    rng = np.random.default_rng(1234)
    tmp = tempfile.mkdtemp(prefix="loom-quantize-")
    src = os.path.join(tmp, "src.gguf")
    data = make_source(src, rng)

    for t in ["f32"] + REFERENCE + list(KQUANT):
        out = os.path.join(tmp, t + ".gguf")
        dry = loom(src, out, t, "--dry-run")
        check(not os.path.exists(out), "%s: --dry-run writes nothing" % t)
        loom(src, out, t, "-t", "2")
        check_file(out, src, data, t)
        d, f = plan_totals(dry.stdout)
        check(d == data_bytes(out) and f == os.path.getsize(out),
              "%s: dry-run totals %s/%s equal the file's %d/%d" %
              (t, d, f, data_bytes(out), os.path.getsize(out)))

    # the row threads do not change the bytes
    for n in ("1", "3"):
        loom(src, os.path.join(tmp, "t%s.gguf" % n), "q4_K", "-t", n)
    a = open(os.path.join(tmp, "t1.gguf"), "rb").read()
    b = open(os.path.join(tmp, "t3.gguf"), "rb").read()
    check(a == b, "-t 1 and -t 3 write the same file")

    # a quantized source
    q4 = os.path.join(tmp, "q4_0.gguf")
    re8 = os.path.join(tmp, "re8.gguf")
    p = loom(q4, re8, "q8_0", ok=False)
    check(p.returncode != 0 and "--allow-requantize" in p.stderr and "q4_0" in p.stderr
          and not os.path.exists(re8),
          "a q4_0 source is refused without --allow-requantize: " + p.stderr.strip())
    loom(q4, re8, "q8_0", "--allow-requantize")
    r4, r8 = tensor_map(gguf.GGUFReader(q4)), tensor_map(gguf.GGUFReader(re8))
    name = "blk.0.attn_q.weight"
    x4 = quants.dequantize(np.asarray(r4[name].data), T.Q4_0).reshape(SHAPES[name])
    ref = quants.quantize(x4, T.Q8_0)
    check(np.asarray(r8[name].data).tobytes() == np.asarray(ref).tobytes(),
          "--allow-requantize: q8_0 of the dequantized q4_0 equals gguf's")

    # errors name what is wrong
    out = os.path.join(tmp, "err.gguf")
    cases = [
        (["/nonexistent/in.gguf", out, "q8_0"], "/nonexistent/in.gguf"),
        ([src, out, "q7_0"], "unknown type 'q7_0'"),
        ([src, out, "q8_0", "--strategy", "nosuch"], "quant strategy nosuch.so: not found"),
        ([src, out, "q8_0", "--strategy", src], "not an ELF shared object"),
        ([src, "/nonexistent/dir/out.gguf", "q8_0"], "/nonexistent/dir/out.gguf"),
        ([src, out], "IN.gguf OUT.gguf TYPE"),
    ]
    for args, want in cases:
        p = loom(*args, ok=False)
        check(p.returncode != 0 and want in p.stderr and not os.path.exists(out),
              "refused %s: %s" % (" ".join(args[2:]) or args, p.stderr.strip()))

    # the strategy as a config key
    cfg = os.path.join(tmp, "loom.ini")
    with open(cfg, "w") as f:
        f.write("strategy = nosuch_cfg\n")
    p = loom(src, out, "q8_0", "--config", cfg, ok=False)
    check(p.returncode != 0 and "nosuch_cfg.so" in p.stderr,
          "config key strategy is used: " + p.stderr.strip())
    with open(cfg, "w") as f:
        f.write("strategy = rtn\n")
    loom(src, out, "q8_0", "--config", cfg)
    check(open(out, "rb").read() == open(os.path.join(tmp, "q8_0.gguf"), "rb").read(),
          "strategy = rtn in a config file writes what the default does")

    out = os.path.join(tmp, "bad.gguf")
    for name, path in sorted(BAD.items()):
        p = loom(src, out, "q8_0", "--strategy", path, ok=False)
        check(p.returncode != 0 and BAD_WANT[name] in p.stderr and not os.path.exists(out)
              and not os.path.exists(out + ".part"),
              "strategy %s refused: %s" % (name, p.stderr.strip()))
    check(len(BAD) in (0, len(BAD_WANT)), "all %d broken strategies given" % len(BAD_WANT))

    subprocess.run(["rm", "-rf", tmp])
    if failures:
        print("%d FAILED" % len(failures))
        sys.exit(1)


main()
