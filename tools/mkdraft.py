#!/usr/bin/env python3
"""Write a smaller draft model by keeping the first N layers of a GGUF.

    python3 tools/mkdraft.py MODEL.gguf OUT.gguf --layers 8

The result shares the target's vocabulary, embedding, output norm and head,
so `loom run --spec=draft.so --spec-draft-model OUT.gguf` accepts it. Tensor
data is copied unchanged (quantized blocks stay as they are); only
`<arch>.block_count` and the layer tensors change. A model that was not
trained for early exit drafts poorly this way; this is a tool for measuring
the draft strategy's machinery on a machine that has no second model.
"""
import argparse
import re
import sys

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("mkdraft: needs the gguf Python package (pip install gguf)")


def copy_field(writer, field, arch, n_layers):
    name = field.name
    if name.startswith("GGUF.") or name == "general.architecture":
        return
    vtype = field.types[0]
    if name == f"{arch}.block_count":
        writer.add_uint32(name, n_layers)
        return
    value = field.contents()
    if vtype == gguf.GGUFValueType.ARRAY:
        writer.add_array(name, value)
    elif vtype == gguf.GGUFValueType.STRING:
        writer.add_string(name, value)
    else:
        writer.add_key_value(name, value, vtype)


def keep_tensor(name, n_layers):
    m = re.match(r"blk\.(\d+)\.", name)
    return m is None or int(m.group(1)) < n_layers


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, required=True)
    a = ap.parse_args()

    r = gguf.GGUFReader(a.model)
    arch = r.fields["general.architecture"].contents()
    total = int(r.fields[f"{arch}.block_count"].contents())
    if not 0 < a.layers < total:
        sys.exit(f"mkdraft: --layers must be in 1..{total - 1}")
    w = gguf.GGUFWriter(a.out, arch)
    for field in r.fields.values():
        copy_field(w, field, arch, a.layers)
    for t in r.tensors:
        if not keep_tensor(t.name, a.layers):
            continue
        # t.data is already in numpy order: (rows, bytes per row) for
        # quantized types, from which the writer recovers the shape.
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
