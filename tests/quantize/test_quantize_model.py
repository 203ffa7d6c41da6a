#!/usr/bin/env python3
"""`loom quantize` on SmolLM2-135M (LOOM_MODEL, Q4_1):

  - --allow-requantize to f32: the tensors of the first, middle and last
    layers and those of no layer equal gguf.quants.dequantize of the
    source (all of them would take NumPy most of the test's time);
  - that f32 to Q4_K_M: each tensor's type is what llama.cpp's Q4_K_M rules
    give (stated below in Python: tied embeddings, use_more_bits for attn_v
    and ffn_down, the fallback of 576-wide rows), and, where llama-quantize
    is built (LLAMA_CPP_BIN, default the cached llama.cpp 0.3.36), the
    same types as its file, the q5_0/q8_0 tensors byte for byte;
  - the Q4_K_M file generates with `loom run --temp 0`, and its perplexity
    (`loom perplexity`, a licence text) is within PPL_REL of the f32's;
  - llama.cpp loads it (llama-perplexity) and gets a perplexity within
    LLAMA_REL of loom's on the same file.
Usage: test_quantize_model.py LOOM_EXE
"""
import os
import re
import shutil
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
MODEL = os.environ.get("LOOM_MODEL", "")
TEXT = "/usr/share/common-licenses/GPL-3"
LLAMA_BIN = os.environ.get("LLAMA_CPP_BIN", os.path.expanduser(
    "~/.cache/loom/llama.cpp-0.3.36/build/bin"))
PPL_REL = 0.15   # Q4_K_M vs f32 on 2 chunks of 64 tokens
LLAMA_REL = 0.05  # llama.cpp vs loom on the same file
failures = []


class Tensor:
    def __init__(self, name, shape, tensor_type, data):
        self.name, self.shape, self.tensor_type, self.data = name, shape, tensor_type, data


class Header:
    """GGUF keys (scalars only) and tensors, read with struct and a NumPy
    memmap: gguf.GGUFReader builds an array per vocabulary string, seconds
    a file here (the reader itself is used on the Q4_K_M file)."""
    SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    VIEW = {gguf.GGMLQuantizationType.F32: np.float32,
            gguf.GGMLQuantizationType.F16: np.float16}
    FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}

    def __init__(self, path):
        with open(path, "rb") as f:
            buf = f.read(64 << 20)
        assert buf[:4] == b"GGUF"
        self.pos = 8
        n_tensors, n_kv = struct.unpack_from("<QQ", buf, self.pos)
        self.pos += 16
        self.fields = {}
        for _ in range(n_kv):
            key = self.string(buf)
            (vt,) = struct.unpack_from("<I", buf, self.pos)
            self.pos += 4
            self.fields[key] = self.value(buf, vt)
        infos = []
        for _ in range(n_tensors):
            name = self.string(buf)
            (nd,) = struct.unpack_from("<I", buf, self.pos)
            ne = struct.unpack_from("<%dQ" % nd, buf, self.pos + 4)
            ty, off = struct.unpack_from("<IQ", buf, self.pos + 4 + 8 * nd)
            self.pos += 4 + 8 * nd + 12
            infos.append((name, list(ne), gguf.GGMLQuantizationType(ty), off))
        align = self.fields.get("general.alignment", 32)
        start = (self.pos + align - 1) // align * align
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        self.tensors = []
        for name, ne, ty, off in infos:
            be, bb = gguf.GGML_QUANT_SIZES[ty]
            n = int(np.prod(ne)) // be * bb
            data = mm[start + off:start + off + n]
            if ty in self.VIEW:
                data = data.view(self.VIEW[ty])
            self.tensors.append(Tensor(name, ne, ty, data))

    def string(self, buf):
        (n,) = struct.unpack_from("<Q", buf, self.pos)
        s = bytes(buf[self.pos + 8:self.pos + 8 + n]).decode()
        self.pos += 8 + n
        return s

    def value(self, buf, vt):
        if vt == 8:
            return self.string(buf)
        if vt == 9:
            at, n = struct.unpack_from("<IQ", buf, self.pos)
            self.pos += 12
            for _ in range(n):
                self.value(buf, at)
            return None
        v = struct.unpack_from(self.FMT[vt], buf, self.pos)[0]
        self.pos += self.SIZES[vt]
        return v



def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(cmd, timeout=300):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.exit("FAIL: %s\n%s%s" % (" ".join(cmd), p.stdout[-2000:], p.stderr[-2000:]))
    return p


def layer(name):
    m = re.match(r"blk\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_types(reader):
    """llama.cpp's Q4_K_M choice per tensor, in its order (layer, name)."""
    names = sorted((t.name for t in reader.tensors), key=lambda n: (layer(n), n))
    shape = {t.name: [int(x) for x in t.shape] for t in reader.tensors}
    arch = reader.fields["general.architecture"]
    n_layer = int(reader.fields[arch + ".block_count"])
    tied = "output.weight" not in shape
    n_v = sum("attn_v.weight" in n for n in names)
    i_v = i_down = 0
    out = {}
    for n in names:
        ne = shape[n]
        if len(ne) < 2 or not n.endswith("weight") or "_norm.weight" in n:
            out[n] = "F32"
            continue
        t = "Q4_K"
        if n == "output.weight" or (tied and n == "token_embd.weight"):
            t = "Q8_0" if ne[0] % 256 else "Q6_K"
        elif "attn_v.weight" in n:
            if more_bits(i_v, n_v):
                t = "Q6_K"
            i_v += 1
        elif "ffn_down" in n:
            if more_bits(i_down, n_layer):
                t = "Q6_K"
            i_down += 1
        if ne[0] % 256:
            t = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}.get(t, t)
        out[n] = t
    return names, out


def perplexity(model):
    p = run([LOOM, "perplexity", "--model", model, "-f", TEXT, "-c", "128", "--chunks", "4",
             "-t", "2"])
    m = re.search(r"perplexity[^0-9]*([0-9.]+)", p.stdout + p.stderr, re.I)
    return float(m.group(1)) if m else None


def main():
    if not os.path.isfile(MODEL):
        print("SKIP: model %r not found (scripts/setup.sh fetches it)" % MODEL)
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="loom-quantize-model-")
    f32 = os.path.join(tmp, "f32.gguf")
    q4km = os.path.join(tmp, "q4km.gguf")
    try:
        run([LOOM, "quantize", "--allow-requantize", MODEL, f32, "f32", "-t", "2"])
        src = {t.name: t for t in Header(MODEL).tensors}
        r32 = Header(f32)
        worst = 0.0
        n_layer = max(layer(n) for n in src) + 1
        sample = [t for t in r32.tensors if layer(t.name) in (-1, 0, n_layer // 2, n_layer - 1)]
        for t in sample:
            s = src[t.name]
            want = quants.dequantize(np.asarray(s.data), s.tensor_type).reshape(-1)
            got = np.asarray(t.data).reshape(-1)
            worst = max(worst, float(np.max(np.abs(got - want))))
        check(worst <= 1e-6 and len(r32.tensors) == len(src),
              "f32 of the Q4_1 model: %d tensors (4 layers and the rest) equal gguf's "
              "dequantization (max diff %g)" % (len(sample), worst))

        run([LOOM, "quantize", f32, q4km, "Q4_K_M", "-t", "2"])
        rq = gguf.GGUFReader(q4km)
        order, want = q4_k_m_types(r32)
        got = [(t.name, t.tensor_type.name) for t in rq.tensors]
        check(got == [(n, want[n]) for n in order],
              "Q4_K_M: tensor order and types are llama.cpp's rules")
        check(int(rq.fields["general.file_type"].parts[-1][0]) == 15,
              "Q4_K_M: general.file_type 15")

        lq = os.path.join(LLAMA_BIN, "llama-quantize")
        if os.access(lq, os.X_OK):
            ll = os.path.join(tmp, "ll.gguf")
            run([lq, f32, ll, "Q4_K_M", "2"])
            rl = {t.name: t for t in Header(ll).tensors}
            check([(n, rl[n].tensor_type.name) for n, _ in got] == got and
                  len(rl) == len(got), "Q4_K_M: the types llama-quantize gives")
            same = [t.name for t in rq.tensors if t.tensor_type.name in ("Q5_0", "Q8_0", "F32")
                    and np.asarray(t.data).tobytes() == np.asarray(rl[t.name].data).tobytes()]
            n_base = sum(t.tensor_type.name in ("Q5_0", "Q8_0", "F32") for t in rq.tensors)
            check(len(same) == n_base,
                  "Q4_K_M: %d of %d q5_0/q8_0/f32 tensors byte-identical to llama-quantize's"
                  % (len(same), n_base))
            os.unlink(ll)
        else:
            print("skip llama-quantize comparison: %s not built" % lq)

        p = run([LOOM, "run", "--model", q4km, "-p", "The capital of France is", "-n", "16",
                 "--temp", "0", "-t", "2", "--no-progress"])
        check(len(p.stdout.strip()) > 0, "loom run on Q4_K_M: %r" % p.stdout.strip()[:80])

        # the f32 holds the Q4_1 model's values exactly (checked above), so
        # the Q4_1 file stands for it here at a fifth of the reading
        p32, pq = perplexity(MODEL), perplexity(q4km)
        check(p32 and pq and abs(pq - p32) <= PPL_REL * p32,
              "perplexity Q4_K_M %s vs its f32 source %s (within %g)" % (pq, p32, PPL_REL))

        lp = os.path.join(LLAMA_BIN, "llama-perplexity")
        if os.access(lp, os.X_OK):
            p = run([lp, "-m", q4km, "-f", TEXT, "-c", "128", "--chunks", "4", "-t", "2"])
            m = re.search(r"Final estimate: PPL = ([0-9.]+)", p.stdout + p.stderr)
            lppl = float(m.group(1)) if m else None
            check(lppl and pq and abs(lppl - pq) <= LLAMA_REL * pq,
                  "llama.cpp loads loom's Q4_K_M: perplexity %s vs loom's %s" % (lppl, pq))
        else:
            print("skip llama.cpp load: %s not built" % lp)
    finally:
        shutil.rmtree(tmp)
    if failures:
        print("%d FAILED" % len(failures))
        sys.exit(1)


main()
