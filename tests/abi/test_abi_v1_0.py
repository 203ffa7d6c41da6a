#!/usr/bin/env python3
"""A backend built against the frozen ABI 1.0 headers, run by today's host.

Usage: test_abi_v1_0.py LOOM_BINARY SKELETON_V1_0_SO

Checks that the module really is a 1.0 plugin (`loom backends --json`
lists it as ABI 1.0, not refused), then that
`loom check-backend` passes it: every op and format against ref.so, the
invalid-argument contracts, batch invariance, and 16 greedy tokens equal to
ref.so's on the default model (LOOM_MODEL). Exit 77 when the model is
missing.
"""
import json
import os
import subprocess
import sys


def main():
    loom, so = sys.argv[1], sys.argv[2]
    model = os.environ.get("LOOM_MODEL", "")
    if not os.path.exists(model):
        print("skip: LOOM_MODEL (%s) not found" % model)
        return 77
    env = dict(os.environ, LOOM_BACKEND_PATH=os.path.dirname(so))
    out = subprocess.run([loom, "backends", "--json"], env=env, capture_output=True,
                         text=True, timeout=120)
    if out.returncode != 0:
        print(out.stdout, out.stderr)
        return 1
    listed = json.loads(out.stdout)
    mine = [b for b in listed.get("backends", []) if b.get("path", "").endswith(
        os.path.basename(so))]
    if not mine:
        print("loom backends does not list %s:\n%s" % (so, out.stdout))
        return 1
    b = mine[0]
    print("listed:", json.dumps(b))
    if b.get("abi") != "1.0" or b.get("refused"):
        print("FAIL: the module reports ABI %r (refused: %r), not a usable 1.0"
              % (b.get("abi"), b.get("refused")))
        return 1
    run = subprocess.run([loom, "check-backend", so, "--model", model, "-n", "16"],
                         capture_output=True, text=True, timeout=280)
    print(run.stdout[-3000:], run.stderr[-2000:])
    if run.returncode != 0:
        print("FAIL: check-backend exit %d on the 1.0 plugin" % run.returncode)
        return 1
    if "e2e" not in run.stdout or "passed" not in run.stdout:
        print("FAIL: no passing greedy comparison in the report")
        return 1
    print("ok: a 1.0 plugin loads and passes check-backend in this host")
    return 0


if __name__ == "__main__":
    sys.exit(main())
