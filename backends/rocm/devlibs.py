#!/usr/bin/env python3
"""Prepares a ROCm device-library folder for a newer clang.

usage: devlibs.py SRC_DIR OUT_DIR LLVM_AS TARGET...

Debian bookworm's device libraries (rocm-device-libs 5.2.3) predate gfx942
and gfx1100: they lack the one-constant oclc_isa_version_<N>.bc that
clang's HIP driver links for each target. OUT_DIR gets links to every
bitcode file of SRC_DIR plus, for each TARGET missing there, that file
assembled with LLVM_AS from the ISA version (major * 1000 + minor * 100 +
stepping). Prints the targets it could serve, one per line.
"""
import os
import re
import subprocess
import sys

# amdgcn data layout of LLVM 17-22, so the linker sees matching modules
LAYOUT = ("e-p:64:64-p1:64:64-p2:32:32-p3:32:32-p4:64:64-p5:32:32-p6:32:32-"
          "p7:160:256:256:32-p8:128:128-p9:192:256:256:32-i64:64-v16:16-v24:32-"
          "v32:32-v48:64-v96:128-v192:256-v256:256-v512:512-v1024:1024-v2048:2048-"
          "n32:64-S32-A5-G1-ni:7:8:9")


def isa_version(target):
    """gfx90a -> 9010, gfx942 -> 9402, gfx1100 -> 11000."""
    m = re.fullmatch(r"gfx(\d+)([0-9a-f])([0-9a-f])", target)
    if not m:
        raise ValueError(f"not a gfx target: {target}")
    return int(m.group(1)) * 1000 + int(m.group(2), 16) * 100 + int(m.group(3), 16)


def main():
    src, out, llvm_as, targets = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(src):
        if name.endswith(".bc"):
            link = os.path.join(out, name)
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(os.path.join(src, name), link)
    for t in targets:
        suffix = t[3:]
        bc = os.path.join(out, f"oclc_isa_version_{suffix}.bc")
        if not os.path.exists(bc):
            ll = os.path.join(out, f"oclc_isa_version_{suffix}.ll")
            with open(ll, "w") as f:
                f.write(f'target datalayout = "{LAYOUT}"\n'
                        'target triple = "amdgcn-amd-amdhsa"\n'
                        "@__oclc_ISA_version = linkonce_odr protected local_unnamed_addr "
                        f"addrspace(4) constant i32 {isa_version(t)}, align 4\n")
            if subprocess.run([llvm_as, ll, "-o", bc]).returncode != 0:
                continue
        print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
