#!/usr/bin/env python3
"""Compare the loom quantization plugins with the gguf Python package.

usage: gguf_ref.py QUANT_TOOL random   synthetic data, every base format
       gguf_ref.py QUANT_TOOL model    Q4_1, Q8_0 (and F32) tensors of $LOOM_MODEL

The plugins are driven by quant_tool (dlopen, as the host does); gguf's numpy
implementation (gguf.quants.quantize / dequantize) is the reference.

What must match:
  * descriptors: type id, block elements and bytes equal gguf's
    GGMLQuantizationType and GGML_QUANT_SIZES;
  * dequantization: bitwise equal float32 (no ulp tolerance). Every product
    in these formats is exact in float32 and the one addition (q*d + m) is
    rounded once on both sides, so there is nothing to tolerate. Where the
    reference gives NaN (random bytes holding an f16 NaN/inf scale), ours
    must be NaN too; NaN payloads are not compared;
  * quantization: bytewise equal to gguf's bytes, for finite inputs whose
    scales stay inside the f16 range. No exception is needed: the plugins
    round exactly as gguf's numpy code (and ggml's C reference) does.

Exit 0 pass, 1 fail, 77 skip (numpy/gguf missing, or the model for `model`).
"""
import os
import shutil
import subprocess
import sys
import tempfile


def skip(msg):
    print(f"SKIP: {msg}")
    sys.exit(77)


try:
    import numpy as np
except ImportError:
    skip("python module numpy is not installed")
try:
    import gguf
    from gguf import GGMLQuantizationType as T
except ImportError:
    skip("python module gguf is not installed")

PLUGINS = {
    "f32": "float", "f16": "float", "bf16": "float",
    "q8_0": "q8", "q4_0": "q4", "q4_1": "q4", "q5_0": "q5", "q5_1": "q5",
    "q2_K": "kquant", "q3_K": "kquant", "q4_K": "kquant", "q5_K": "kquant",
    "q6_K": "kquant", "mxfp4": "mxfp4",
}
# gguf has no quantizer for these; only decoding is compared with gguf.
DEQUANT_ONLY = ("q2_K", "q3_K", "q4_K", "q5_K", "q6_K")
failures = []


def fail(msg):
    print(f"FAIL: {msg}")
    failures.append(msg)


def plugin_path(fmt):
    root = os.environ.get("LOOM_BUILD_ROOT")
    if not root:
        print("LOOM_BUILD_ROOT is not set")
        sys.exit(1)
    return os.path.join(root, "plugins", "quant", PLUGINS[fmt] + ".so")


class Tool:
    def __init__(self, exe, tmp):
        self.exe, self.tmp = exe, tmp

    def run(self, *args):
        r = subprocess.run([self.exe, *map(str, args)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"quant_tool {' '.join(map(str, args))}: {r.stderr.strip()}")
        return r.stdout

    def dequant_bytes(self, fmt, data):
        src, dst = os.path.join(self.tmp, "in.bin"), os.path.join(self.tmp, "out.bin")
        np.ascontiguousarray(data).tofile(src)
        self.run("dequant", plugin_path(fmt), fmt, src, dst)
        return np.fromfile(dst, dtype=np.float32)

    def dequant_file(self, fmt, path, offset, nbytes):
        dst = os.path.join(self.tmp, "out.bin")
        self.run("dequant", plugin_path(fmt), fmt, path, dst, offset, nbytes)
        return np.fromfile(dst, dtype=np.float32)

    def quant(self, fmt, x):
        src, dst = os.path.join(self.tmp, "in.bin"), os.path.join(self.tmp, "out.bin")
        np.ascontiguousarray(x, dtype=np.float32).tofile(src)
        self.run("quant", plugin_path(fmt), fmt, src, dst)
        return np.fromfile(dst, dtype=np.uint8)


def same_floats(what, got, want):
    want = np.ascontiguousarray(want, dtype=np.float32).reshape(-1)
    if got.shape != want.shape:
        fail(f"{what}: {got.size} values, want {want.size}")
        return
    gn, wn = np.isnan(got), np.isnan(want)
    bad = (gn != wn) | (~wn & (got.view(np.uint32) != want.view(np.uint32)))
    if bad.any():
        i = int(np.argmax(bad))
        fail(f"{what}: {int(bad.sum())} of {got.size} values differ, first at {i}: "
             f"got {got[i]!r} want {want[i]!r}")
    else:
        print(f"ok   {what}: {got.size} values bitwise equal")


def same_bytes(what, got, want):
    want = np.ascontiguousarray(want).view(np.uint8).reshape(-1)
    if got.shape != want.shape:
        fail(f"{what}: {got.size} bytes, want {want.size}")
    elif (got != want).any():
        i = int(np.argmax(got != want))
        fail(f"{what}: {int((got != want).sum())} of {got.size} bytes differ, "
             f"first at {i}: got {got[i]:#04x} want {want[i]:#04x}")
    else:
        print(f"ok   {what}: {got.size} bytes equal")


def check_descriptors(tool):
    out = tool.run("list", *sorted({plugin_path(f) for f in PLUGINS}))
    seen = {}
    for line in out.splitlines():
        w = line.split()
        if w[0] == "plugin" and (int(w[2]) != 1 or int(w[4]) <= 0):
            fail(f"plugin {w[1]}: abi {w[2]}.{w[3]} size {w[4]}")
        if w[0] == "format":
            seen[w[1]] = tuple(int(v) for v in w[2:5])
    for fmt in PLUGINS:
        qt = qtype(fmt)
        want = (int(qt), *gguf.GGML_QUANT_SIZES[qt])
        if seen.get(fmt) != want:
            fail(f"descriptor {fmt}: (type, elems, bytes) {seen.get(fmt)}, gguf says {want}")
        else:
            print(f"ok   descriptor {fmt} {want}")


def check_exports():
    nm = shutil.which("nm")
    if not nm:
        print("note: nm not found, export check not run")
        return
    for so in sorted({plugin_path(f) for f in PLUGINS}):
        out = subprocess.run([nm, "-D", "--defined-only", so], capture_output=True,
                             text=True, check=True).stdout
        syms = [ln.split()[-1] for ln in out.splitlines()
                if len(ln.split()) == 3 and ln.split()[1] in "TtDdBbRr"]
        if syms != ["loom_quant_entry"]:
            fail(f"{so} exports {syms}, want only loom_quant_entry")
        else:
            print(f"ok   {os.path.basename(so)} exports only loom_quant_entry")


def reference_quant(fmt, x):
    if fmt == "f32":
        return x.astype(np.float32)
    if fmt == "f16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16)
    return gguf.quants.quantize(x, qtype(fmt))


def qtype(fmt):
    return T[fmt.upper()]


def reference_dequant(fmt, raw):
    return gguf.quants.dequantize(raw.view(np.uint8).reshape(-1), qtype(fmt))


def synthetic(rng, n_rows, row):
    """Rows of mixed shapes: gaussian at many scales, outliers, one-signed
    blocks, constant and zero blocks, exact ties in magnitude."""
    x = rng.standard_normal((n_rows, row)).astype(np.float32)
    x *= np.float32(2.0) ** rng.integers(-12, 8, size=(n_rows, 1)).astype(np.float32)
    x[1] = np.abs(x[1]) + 1
    x[2] = -np.abs(x[2])
    x[3, :64] = 0.37
    x[4, :32] = 0
    x[5, 0:32:2] = 3.0          # ties in |x|: argmax takes the first
    x[5, 1:32:2] = -3.0
    x[6, 32:64] = rng.integers(-8, 8, 32) * 0.25    # exact grids
    x[7, :] *= np.where(rng.random(row) < 0.05, 100, 1).astype(np.float32)
    x[8, :] = (rng.integers(-100, 100, row) + 0.5).astype(np.float32) / 64  # q8 ties
    return x


def f16_specials():
    v = np.array([1, -2, 65504, 65519.99, 65520, 1e10, np.inf, -np.inf, 2 ** -24,
                  2 ** -25, 3 * 2 ** -25, 2 ** -14 - 2 ** -25, 1 + 2 ** -11,
                  1 + 3 * 2 ** -11, 0.1, -0.0, 2 ** -30], dtype=np.float32)
    return np.concatenate([v, np.random.default_rng(7).standard_normal(15).astype(np.float32)
                           * np.float32(1e-6)])


def run_random(tool):
    check_descriptors(tool)
    check_exports()
    rng = np.random.default_rng(20240531)
    for fmt in PLUGINS:
        x = synthetic(rng, 64, 256)
        if fmt in DEQUANT_ONLY:
            # Our own simple quantizer: gguf must decode its blocks to the
            # same floats as our to_float does (layout agreement).
            ours = tool.quant(fmt, x)
            same_floats(f"{fmt} gguf decodes our blocks like to_float",
                        tool.dequant_bytes(fmt, ours), reference_dequant(fmt, ours))
            err = np.abs(reference_dequant(fmt, ours).reshape(x.shape) - x)
            rel = float((err.max(axis=1) / np.abs(x).max(axis=1)).max())
            print(f"note {fmt}: max |err| / row max|x| <= {rel:.3g}")
        elif fmt in ("f16", "bf16", "f32"):
            x = np.concatenate([x.reshape(-1), f16_specials()])
        if fmt not in DEQUANT_ONLY:
            ref = np.ascontiguousarray(reference_quant(fmt, x)).view(np.uint8).reshape(-1)
            same_bytes(f"{fmt} quantize ({x.size} values)", tool.quant(fmt, x), ref)
            same_floats(f"{fmt} dequantize gguf's blocks", tool.dequant_bytes(fmt, ref),
                        reference_dequant(fmt, ref))
        # Arbitrary bytes: every scale bit pattern, including f16 NaN/inf.
        nbytes = gguf.GGML_QUANT_SIZES[qtype(fmt)][1] * 4096
        raw = rng.integers(0, 256, nbytes, dtype=np.uint8)
        with np.errstate(all="ignore"):
            want = reference_dequant(fmt, raw)
        same_floats(f"{fmt} dequantize random bytes", tool.dequant_bytes(fmt, raw), want)


def run_model(tool):
    path = os.environ.get("LOOM_MODEL", "")
    if not path or not os.path.isfile(path):
        skip(f"model file not found: {path or '$LOOM_MODEL unset'}")
    reader = gguf.GGUFReader(path)
    names = {T.Q4_1: "q4_1", T.Q8_0: "q8_0", T.F32: "f32"}
    counts = {}
    for t in reader.tensors:
        fmt = names.get(t.tensor_type)
        if fmt is None:
            continue
        raw = np.asarray(t.data).view(np.uint8).reshape(-1)
        if raw.size != t.n_bytes:
            fail(f"{t.name}: reader gives {raw.size} bytes, n_bytes {t.n_bytes}")
            continue
        got = tool.dequant_file(fmt, path, int(t.data_offset), int(t.n_bytes))
        want = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        before = len(failures)
        same_floats(f"{t.name} ({fmt})", got, want)
        if len(failures) == before:
            counts[fmt] = counts.get(fmt, 0) + 1
    if not counts.get("q4_1") or not counts.get("q8_0"):
        fail(f"model has no Q4_1 or Q8_0 tensor that matched: {counts}")
    print(f"tensors matched per format: {counts}")


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in ("random", "model"):
        print(__doc__)
        return 1
    with tempfile.TemporaryDirectory(prefix="loom-quant-") as tmp:
        tool = Tool(sys.argv[1], tmp)
        (run_random if sys.argv[2] == "random" else run_model)(tool)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
