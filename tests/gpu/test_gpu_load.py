#!/usr/bin/env python3
"""cuda.so / rocm.so (and the emulated gpuemu.so / gpuemu64.so) with and
without a device.

usage: test_gpu_load.py BACKEND LOOM_EXE CONFORMANCE_EXE

1. The entry symbol, called through ctypes, returns an ABI 1 table named
   after the backend; create() with a fake host answers LOOM_ERR_DEVICE and
   logs "no <vendor> device or driver found: <runtime reason>".
2. `loom run --backend=BACKEND` exits non-zero saying no device or driver
   was found (the loader's wording) and does not crash.
3. The conformance suite finds the backend in the build tree by name and
   reports it as a skip for want of a device, not as missing.

On a machine that has the device (/dev/nvidia0 for cuda, /dev/kfd for
rocm) steps 1-2 instead require create() to succeed and loom run to work,
and step 3 requires the conformance suite to pass; loom run prints the
memory plan (LOOM_DEBUG=1) with no tensor converted to f32, and on the
emulators a device capped at 256 MiB (LOOM_GPUEMU_MEM_MB) refuses the
model with the plan before allocating anything for it. The emulated backends
have a device unless LOOM_GPUEMU_DEVICES=0, which the meson file uses to
run the no-device steps on them for real.
Exit 77 when the backend was not built or the model is missing.
"""
import ctypes
import glob
import os
import subprocess
import sys

LOOM_ERR_DEVICE = -4


class Host(ctypes.Structure):
    _fields_ = [("abi_major", ctypes.c_uint32), ("struct_size", ctypes.c_uint32),
                ("host", ctypes.c_void_p), ("log", ctypes.c_void_p),
                ("format_info", ctypes.c_void_p), ("to_float", ctypes.c_void_p)]


class Config(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("device", ctypes.c_int32),
                ("n_threads", ctypes.c_int32), ("flags", ctypes.c_uint32)]


class OpsHead(ctypes.Structure):
    _fields_ = [("abi_major", ctypes.c_uint32), ("abi_minor", ctypes.c_uint32),
                ("struct_size", ctypes.c_uint32), ("name", ctypes.c_char_p),
                ("create", ctypes.c_void_p), ("destroy", ctypes.c_void_p)]


LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)
CREATE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Host), ctypes.POINTER(Config),
                             ctypes.POINTER(ctypes.c_void_p))
DESTROY_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def check_abi(path, stem, has_device):
    lib = ctypes.CDLL(path)
    entry = lib.loom_backend_entry
    entry.restype = ctypes.POINTER(OpsHead)
    ops = entry().contents
    check(ops.abi_major == 1, f"{stem}: abi_major {ops.abi_major} == 1")
    # ABI 1.0: 3 x uint32 (+ padding) and the name, then 20 function slots
    check(ops.struct_size >= 24 + 20 * 8, f"{stem}: ops table of {ops.struct_size} bytes")
    check(ops.name == stem.encode(), f"{stem}: table name {ops.name!r}")
    logs = []
    log = LOG_FN(lambda h, lvl, msg: logs.append(msg.decode()))
    host = Host(1, ctypes.sizeof(Host), None, ctypes.cast(log, ctypes.c_void_p), None, None)
    cfg = Config(ctypes.sizeof(Config), 0, 0, 0)
    ctx = ctypes.c_void_p(12345)
    rc = CREATE_FN(ops.create)(ctypes.byref(host), ctypes.byref(cfg), ctypes.byref(ctx))
    if has_device:
        check(rc == 0 and ctx.value, f"{stem}: create() on device 0 succeeds (rc {rc})")
        if rc == 0:
            DESTROY_FN(ops.destroy)(ctx)
        return
    vendor = {"cuda": "CUDA", "rocm": "ROCm/HIP"}.get(stem, "emulator")
    check(rc == LOOM_ERR_DEVICE, f"{stem}: create() without a device returns LOOM_ERR_DEVICE (got {rc})")
    check(ctx.value is None, f"{stem}: create() leaves *out NULL on failure")
    want = f"{stem}: no {vendor} device or driver found: "
    check(any(m.startswith(want) and len(m) > len(want) for m in logs),
          f"{stem}: create() logs '{want}<reason>' (logged: {logs})")


def check_run(loom, stem, model, has_device):
    p = subprocess.run([loom, "run", f"--backend={stem}.so", "--model", model, "-p", "Hi",
                        "-n", "4"], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, LOOM_DEBUG="1"))
    out = p.stdout + p.stderr
    check(p.returncode >= 0, f"loom run --backend={stem}.so did not crash (rc {p.returncode})")
    if has_device:
        check(p.returncode == 0, f"loom run --backend={stem}.so works on a device:\n{out}")
        check(f"memory plan on {stem}: weights " in out and
              "; 0 tensors converted to f32 at load)" in out,
              f"loom run --backend={stem}.so prints its memory plan, nothing converted to f32:\n{out}")
        return
    check(p.returncode != 0, f"loom run --backend={stem}.so exits non-zero without a device")
    check("no usable device or driver found" in out,
          f"loom run --backend={stem}.so says no device or driver was found:\n{out}")


def check_memory_plan(loom, stem, model):
    """An emulated device of 256 MiB cannot hold the model, its KV cache and
    the backend's reserve: refused by the memory plan, before the weights
    or the cache are allocated (whose failures say "cannot allocate")."""
    p = subprocess.run([loom, "run", f"--backend={stem}.so", "--model", model, "-p", "Hi",
                        "-n", "4"], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, LOOM_GPUEMU_MEM_MB="256"))
    out = p.stdout + p.stderr
    check(p.returncode > 0, f"loom run --backend={stem}.so on 256 MiB exits non-zero (rc {p.returncode})")
    check(f"does not fit on backend {stem}" in out and "weights " in out and "KV cache " in out
          and "activations " in out and "free of 256.0 MiB" in out and "cannot allocate" not in out,
          f"loom run --backend={stem}.so on 256 MiB is refused with the memory plan:\n{out}")


def built_backend(stem):
    """The build tree's STEM.so (in backends/<folder>/, as the loader looks), or None."""
    root = os.environ.get("LOOM_BUILD_ROOT", "")
    found = glob.glob(os.path.join(root, "backends", "*", f"{stem}.so"))
    return found[0] if found else None


def check_conformance(conf, stem, has_device):
    # exact mode (f32 activations) and fast mode (8-bit activations in the
    # q4_0, q8_0, q4_K, q6_K GEMV), each against ref.so with its tolerances
    p = subprocess.run([conf, f"{stem}.so:LOOM_GPU_EXACT=1", f"{stem}.so:LOOM_GPU_EXACT=0"],
                       capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    if has_device:
        check(p.returncode == 0, f"conformance of {stem}.so (exact and fast) passes:\n{out[-4000:]}")
        return
    skip = [l for l in out.splitlines() if l.startswith(f"SKIP {stem}.so")]
    check(len(skip) == 2 and all("no usable device or driver found" in l and
                                 f"/{stem}.so" in l and "/backends/" in l for l in skip),
          f"conformance finds {stem}.so in the build tree and skips it (both modes) for want of a device: {skip}")
    check(p.returncode == 0, f"conformance run with only {stem}.so exits 0 (rc {p.returncode})")


def main():
    stem, loom, conf = sys.argv[1], sys.argv[2], sys.argv[3]
    path = built_backend(stem)
    if not path:
        print(f"{stem}.so was not built (no toolkit): skipping")
        return 77
    model = os.environ.get("LOOM_MODEL", "")
    if not os.path.isfile(model):
        print(f"model {model!r} missing: skipping")
        return 77
    if stem.startswith("gpuemu"):
        has_device = os.environ.get("LOOM_GPUEMU_DEVICES", "1") != "0"
    else:
        has_device = os.path.exists("/dev/nvidia0" if stem == "cuda" else "/dev/kfd")
    print(f"{stem}.so: {'a device node exists' if has_device else 'no device node'}")
    check_abi(path, stem, has_device)
    check_run(loom, stem, model, has_device)
    if has_device and stem.startswith("gpuemu"):
        check_memory_plan(loom, stem, model)
    check_conformance(conf, stem, has_device)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
