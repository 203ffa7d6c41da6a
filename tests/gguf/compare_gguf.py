#!/usr/bin/env python3
"""Cross-checks core/format/gguf.c (through gguf_dump) against the gguf Python
package's GGUFReader on the real model and the vocab-only files: header,
every key (type, element type, count, scalar value, every array element)
and every tensor (name, type, shape, offset, byte size). Also compares the
reader's type geometry table with gguf.constants.GGML_QUANT_SIZES.

usage: compare_gguf.py GGUF_DUMP [FILE...]
Without FILEs: $LOOM_MODEL and $LOOM_SHARED_DIR/data/tokenizer/*.gguf;
exits 77 when none of them exists.
"""
import glob
import math
import os
import subprocess
import sys

import gguf
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

# gguf-py still lists q8_1 with f32 d and s (40 bytes); ggml's block_q8_1
# has two f16 (36 bytes) and no GGUF file stores q8_1.
GEOMETRY_EXCEPTIONS = {9}

errors = []


def fail(msg):
    errors.append(msg)
    if len(errors) <= 30:
        print("MISMATCH:", msg)


def dump(exe, arg):
    out = subprocess.run([exe, arg], check=True, capture_output=True).stdout
    return [line.split(b"\t") for line in out.splitlines()]


def unhex(s):
    return b"" if s == b"-" else bytes.fromhex(s.decode())


def check_types(exe):
    ours = {int(r[1]): (r[2].decode(), int(r[3]), int(r[4])) for r in dump(exe, "--types")}
    for t, (be, bb) in GGML_QUANT_SIZES.items():
        if t.value >= 40 or t.value in GEOMETRY_EXCEPTIONS:
            continue
        if t.value not in ours:
            fail(f"type {t.name} ({t.value}) unknown to gguf.c")
            continue
        name, obe, obb = ours[t.value]
        if name.lower() != t.name.lower() or (obe, obb) != (be, bb):
            fail(f"type {t.value}: gguf.c {name} {obe}/{obb}, gguf-py {t.name} {be}/{bb}")
    for v in ours:
        if v not in {t.value for t in GGMLQuantizationType}:
            fail(f"gguf.c knows type {v} that gguf-py does not")


def field_bytes(field):
    return b"".join(bytes(field.parts[i]) for i in field.data)


def check_scalar(path, key, field, vtype, val):
    part = field.parts[field.data[0]]
    if vtype == gguf.GGUFValueType.STRING:
        if bytes(part) != unhex(val):
            fail(f"{path}: {key}: string differs")
        return
    want = part[0].item()
    if isinstance(want, float):
        got = float(val)
        if not (got == want or (math.isnan(got) and math.isnan(want))):
            fail(f"{path}: {key}: {got} != {want}")
    elif int(val) != int(want):
        fail(f"{path}: {key}: {val} != {want}")


def check_kvs(path, reader, rows):
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    keys = [unhex(r[1]).decode() for r in rows if r[0] == b"K"]
    if keys != list(fields):
        fail(f"{path}: key lists differ")
    strs = {}
    raws = {}
    for r in rows:
        if r[0] == b"S":
            strs.setdefault(unhex(r[1]).decode(), []).append(unhex(r[3]))
        elif r[0] == b"A":
            raws[unhex(r[1]).decode()] = unhex(r[2])
    for r in rows:
        if r[0] != b"K":
            continue
        key = unhex(r[1]).decode()
        field = fields.get(key)
        if field is None:
            continue
        vtype, atype, n = int(r[2]), int(r[3]), int(r[4])
        if vtype != field.types[0]:
            fail(f"{path}: {key}: type {vtype} != {field.types[0]}")
            continue
        if vtype != gguf.GGUFValueType.ARRAY:
            check_scalar(path, key, field, vtype, r[5])
            continue
        if atype != field.types[1] or n != len(field.data):
            fail(f"{path}: {key}: array {atype}x{n} != {field.types[1]}x{len(field.data)}")
            continue
        if atype == gguf.GGUFValueType.STRING:
            want = [bytes(field.parts[i]) for i in field.data]
            if strs.get(key, []) != want:
                fail(f"{path}: {key}: string elements differ")
        elif raws.get(key) != field_bytes(field):
            fail(f"{path}: {key}: array elements differ")


def check_tensors(path, reader, rows):
    ours = [r for r in rows if r[0] == b"T"]
    if len(ours) != len(reader.tensors):
        fail(f"{path}: {len(ours)} tensors != {len(reader.tensors)}")
    for r, t in zip(ours, reader.tensors):
        name = unhex(r[1]).decode()
        shape = [int(x) for x in r[3].split(b",")] if r[3] else []
        offset = int(r[4])
        nbytes = int(r[5])
        want = (t.name, int(t.tensor_type), [int(x) for x in t.shape],
                int(t.data_offset) - reader.data_offset, int(t.n_bytes))
        got = (name, int(r[2]), shape, offset, nbytes)
        if got != want:
            fail(f"{path}: tensor {got} != {want}")


def check_file(exe, path):
    reader = gguf.GGUFReader(path)
    rows = dump(exe, path)
    h = rows[0]
    size = os.path.getsize(path)
    n_kv = len([k for k in reader.fields if not k.startswith("GGUF.")])
    want = (int(reader.fields["GGUF.version"].parts[-1][0]), n_kv, len(reader.tensors),
            min(reader.data_offset, size), reader.alignment)
    got = tuple(int(x) for x in h[1:6])
    if got != want:
        fail(f"{path}: header {got} != {want}")
    check_kvs(path, reader, rows)
    check_tensors(path, reader, rows)
    print(f"{path}: {n_kv} keys, {len(reader.tensors)} tensors compared")


def main():
    exe = sys.argv[1]
    files = sys.argv[2:]
    if not files:
        model = os.environ.get("LOOM_MODEL", "")
        shared = os.environ.get("LOOM_SHARED_DIR", "")
        if model and os.path.exists(model):
            files.append(model)
        files += sorted(glob.glob(os.path.join(shared, "data", "tokenizer", "*.gguf")))
        if not files:
            print(f"neither the model ({model}) nor {shared}/data/tokenizer/*.gguf found")
            check_types(exe)
            return 77 if not errors else 1
    check_types(exe)
    for path in files:
        check_file(exe, path)
    if errors:
        print(f"{len(errors)} mismatches")
        return 1
    print("all match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
