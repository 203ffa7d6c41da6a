#!/usr/bin/env python3
"""Write a Q4_K_M-like GGUF from another quantization of the same model.

    python3 bench/mk_q4km.py IN.gguf OUT.gguf [--build build]

Until loom has its own `quantize` command, this is how the benchmarks get a
K-quant file from the Q4_1 SmolLM2 GGUF: every tensor is dequantized with
the gguf package and requantized with llama.cpp's Q4_K_M choice of types:

  ffn_down, attn_v   q6_K in the "more bits" layers (first and last eighth,
                     every third between), q4_K elsewhere
  other matrices     q4_K
  token_embd         kept as it is; 1-D tensors stay f32

and, as llama.cpp does, a matrix whose rows are not a multiple of 256
values falls back: q4_K to q5_0, q6_K to q8_0 (made by the gguf package).
In SmolLM2-135M (width 576) only ffn_down (1536 wide) takes K-quants.

K-quant blocks come from loom's own kquant plugin (its from_float, driven
by the build's tests/quant/quant_tool), not from ggml's quantizer, so the
bytes differ from llama-quantize's; the types, sizes and kernels used are
the same, which is what a speed measurement needs.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

try:
    import gguf
    from gguf.quants import dequantize, quantize
except ImportError:
    sys.exit("mk_q4km: needs the gguf Python package (pip install gguf)")

T = gguf.GGMLQuantizationType
FALLBACK = {T.Q4_K: T.Q5_0, T.Q6_K: T.Q8_0}
Q4_K_M_FILE_TYPE = 15


def copy_field(writer, field):
    name = field.name
    if name.startswith("GGUF.") or name == "general.architecture":
        return
    if name == "general.file_type":
        writer.add_uint32(name, Q4_K_M_FILE_TYPE)
        return
    vtype = field.types[0]
    value = field.contents()
    if vtype == gguf.GGUFValueType.ARRAY:
        writer.add_array(name, value)
    elif vtype == gguf.GGUFValueType.STRING:
        writer.add_string(name, value)
    else:
        writer.add_key_value(name, value, vtype)


def more_bits(layer, n_layers):
    return (layer < n_layers // 8 or layer >= 7 * n_layers // 8 or
            (layer - n_layers // 8) % 3 == 2)


def pick_type(name, k, n_layers):
    m = re.match(r"blk\.(\d+)\.(attn_v|ffn_down)\.weight$", name)
    want = T.Q6_K if m and more_bits(int(m.group(1)), n_layers) else T.Q4_K
    return want if k % 256 == 0 else FALLBACK[want]


def k_quantize(x, qtype, build):
    """Rows of x (float32) as K-quant blocks, through the kquant plugin."""
    tool = os.path.join(build, "tests", "quant", "quant_tool")
    plugin = os.path.join(build, "plugins", "quant", "kquant.so")
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in.f32"), os.path.join(tmp, "out.bin")
        np.ascontiguousarray(x, dtype=np.float32).tofile(src)
        subprocess.run([tool, "quant", plugin, "q" + qtype.name[1:],
                        src, dst], check=True)
        blocks = np.fromfile(dst, dtype=np.uint8)
    return blocks.reshape(x.shape[0], -1)


def requantize(t, n_layers, build):
    """(data, type) of tensor t in the Q4_K_M-like file."""
    if t.name == "token_embd.weight" or len(t.shape) < 2:
        return np.asarray(t.data), t.tensor_type
    x = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
    k = x.shape[-1]
    qtype = pick_type(t.name, k, n_layers)
    if qtype in FALLBACK:
        return k_quantize(x.reshape(-1, k), qtype, build), qtype
    return quantize(x, qtype), qtype


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--build", default="build")
    a = ap.parse_args()

    r = gguf.GGUFReader(a.model)
    arch = r.fields["general.architecture"].contents()
    n_layers = int(r.fields[f"{arch}.block_count"].contents())
    w = gguf.GGUFWriter(a.out, arch)
    for field in r.fields.values():
        copy_field(w, field)
    counts = {}
    for t in r.tensors:
        data, qtype = requantize(t, n_layers, a.build)
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
        w.add_tensor(t.name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("mk_q4km: wrote %s (%s)" % (a.out, ", ".join(
        "%d %s" % (n, q) for q, n in sorted(counts.items()))))


if __name__ == "__main__":
    main()
