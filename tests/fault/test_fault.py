#!/usr/bin/env python3
"""Backend failures reach the user as a clear error, never a crash, hang or
leak.

Usage: test_fault.py LOOM_BINARY FAULTSHIM_SO TARGET_SO ENGINE_TARGET_SO
                     [ENGINE_TEST [ENGINE_TEST_ASAN]]

faultshim.so (tests/fault/fault_shim.c) forwards every slot to TARGET_SO
(ref.so) and fails one call: the first call of a named slot
(LOOM_FAULT_SLOT), or the N-th call of any slot (LOOM_FAULT_AT). For each
slot that returns a status, and for call numbers spread over a whole
`loom run` (model load, prefill, decode steps), this runs `loom run` and
requires: no signal, no timeout, and either success (a call whose failure
the host may tolerate, like device_info) or exit status 1 with one
`error:` line. Where LeakSanitizer's runtime is found (gcc's liblsan), the
slot cases and a sample of call numbers also run under it
(LD_PRELOAD, LSAN_OPTIONS=exitcode=23): nothing the host allocated may be
left behind on any error path. ENGINE_TEST (test_fault_engine.c) then
runs the engine-level cases through the public API (one final event per
request, every KV block back, the next request served) over
ENGINE_TARGET_SO (cpu.so: the same slots fail there, 3x faster than
ref.so over two engine runs of 26 cases), under
LeakSanitizer too where found, and ENGINE_TEST_ASAN the same against the
core built with AddressSanitizer (leak detection on where LeakSanitizer
can run here: it needs ptrace, which some sandboxes refuse). Exit 77 when
the model is missing.
"""
import glob
import os
import subprocess
import sys

SLOTS = ("create", "device_info", "buffer_alloc", "upload", "download", "copy",
         "synchronize", "gemm", "embed", "rmsnorm", "rope", "glu", "add",
         "kv_write", "attention")
TOLERATED = {"device_info"}  # informational: loom may run without it
LEAK_EXIT = 23


def lsan_works(env):
    """Whether LeakSanitizer can run here: it stops the world with ptrace,
    which some sandboxes refuse (it then fails every run, leak or not)."""
    true = "/bin/true" if os.path.exists("/bin/true") else "/usr/bin/true"
    try:
        p = subprocess.run([true], env=env, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0 and "LeakSanitizer" not in p.stderr


def has_asan(binary):
    """Whether binary is built with AddressSanitizer (scripts/asan.sh): its
    own LeakSanitizer runs then, and preloading liblsan beside it aborts
    every run ("ASan runtime does not come first")."""
    with open(binary, "rb") as f:
        return b"__asan_init" in f.read()


def lsan_runtime(loom):
    if has_asan(loom):
        return None
    for pat in ("/usr/lib/x86_64-linux-gnu/liblsan.so.0",
                "/usr/lib/gcc/x86_64-linux-gnu/*/liblsan.so"):
        found = sorted(glob.glob(pat))
        if found and lsan_works(dict(os.environ, LD_PRELOAD=found[-1])):
            return found[-1]
    return None


def run(loom, shim, target, model, extra_env, lsan=None):
    env = dict(os.environ, LOOM_FAULT_TARGET=target, **extra_env)
    if lsan:
        env["LD_PRELOAD"] = lsan
        env["LSAN_OPTIONS"] = "exitcode=%d" % LEAK_EXIT
    cmd = [loom, "run", "--backend=" + shim, "--model", model, "-p", "Hello there",
           "-n", "2", "--temp", "0"]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return None, "timed out"
    return p.returncode, p.stderr


def judge(what, rc, err, tolerated=False):
    if rc is None:
        return "%s: %s" % (what, err)
    if rc < 0:
        return "%s: killed by signal %d\n%s" % (what, -rc, err[-2000:])
    if rc == LEAK_EXIT:
        return "%s: leaks\n%s" % (what, err[-3000:])
    if rc == 0:
        return None if tolerated or what.startswith("call") else \
            "%s: the failure went unnoticed (exit 0)" % what
    lines = [l for l in err.splitlines() if "error:" in l]
    if rc != 1 or len(lines) != 1:
        return "%s: exit %d, %d error lines\n%s" % (what, rc, len(lines), err[-2000:])
    return None


def main():
    loom, shim, target, engine_target = sys.argv[1:5]
    model = os.environ.get("LOOM_MODEL", "")
    if not os.path.exists(model):
        print("skip: LOOM_MODEL (%s) not found" % model)
        return 77
    rc, err = run(loom, shim, target, model, {"LOOM_FAULT_COUNT": "1"})
    total = [int(l.split()[1]) for l in err.splitlines() if l.startswith("faultshim:")]
    if rc != 0 or not total:
        print("FAIL: the run without a fault: exit %r\n%s" % (rc, err))
        return 1
    total = total[0]
    calls = sorted(set([1, 2, 3, 5, 8, 13, 21] +
                       [1 + i * (total - 1) // 30 for i in range(31)]))
    lsan = lsan_runtime(loom)
    failures, cases = [], 0
    for s in SLOTS:
        rc, err = run(loom, shim, target, model, {"LOOM_FAULT_SLOT": s}, lsan)
        cases += 1
        f = judge("slot " + s, rc, err, s in TOLERATED)
        if f:
            failures.append(f)
    for i, n in enumerate(calls):
        rc, err = run(loom, shim, target, model, {"LOOM_FAULT_AT": str(n)},
                      lsan if i % 3 == 0 else None)
        cases += 1
        f = judge("call %d of %d" % (n, total), rc, err)
        if f:
            failures.append(f)
    for i, engine_test in enumerate(sys.argv[5:7]):
        asan = i == 1  # the core built with AddressSanitizer
        env = dict(os.environ, LOOM_FAULT_TARGET=engine_target)
        if asan:
            env["ASAN_OPTIONS"] = "detect_leaks=%d:exitcode=%d" % (1 if lsan else 0,
                                                                  LEAK_EXIT)
        elif lsan:
            env["LD_PRELOAD"] = lsan
            env["LSAN_OPTIONS"] = "exitcode=%d" % LEAK_EXIT
        what = "engine cases" + (" (AddressSanitizer)" if asan else "")
        try:
            p = subprocess.run([engine_test, shim], env=env, capture_output=True,
                               text=True, timeout=300)
            print(what + ":\n" + p.stdout[-3000:])
            f = None
            if p.returncode != 0:
                f = "%s: exit %d\n%s\n%s" % (what, p.returncode, p.stdout[-2000:],
                                            p.stderr[-4000:])
        except subprocess.TimeoutExpired:
            f = what + ": timed out"
        if f:
            failures.append(f)
    print("%d fault cases (%d calls in a clean run; LeakSanitizer %s), %d failed"
          % (cases, total, lsan or ("ASan's own" if has_asan(loom) else
                                     "not found: leaks not checked"), len(failures)))
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
