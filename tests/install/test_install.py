#!/usr/bin/env python3
"""What `meson install` ships, used the way a user and a backend author do.

Installs the build into a temporary DESTDIR (outside the build tree), then,
with every LOOM_*_PATH unset and an empty per-user folder:

1. the installed `loom backends` searches only the installed folder, and
   `loom run` generates text on SmolLM2 with every plugin it dlopens
   (LD_DEBUG=files lists them) inside the DESTDIR: nothing from the build
   tree, so deleting the build tree would change nothing;
2. examples/backend-skeleton builds out of tree against the installed
   loom-backend.pc (meson, dependency('loom-backend')) and passes the
   installed `loom check-backend` (with --model: 16 greedy tokens equal to
   ref.so's);
3. the skeleton compiled with -DSKELETON_BREAK_RMSNORM (plain cc with
   `pkg-config --cflags loom-backend`) fails check-backend, non-zero, and
   the error names rmsnorm;
4. `loom backends` shows the per-user folder's backend and refuses a
   non-ELF file, an ABI-2 backend and a table with a missing slot, each with
   the loader's reason;
5. libloom.so.0 exports exactly loom.h's functions, and examples/embed
   builds out of tree against the installed loom.pc and streams the same
   text as `loom run`; neither the loom command nor libloom links libmpi,
   which only the installed MPI module dist/mpi.so does, and a
   single-host `loom run` loads neither (libloom_check.py, step 1).

Usage: test_install.py BUILD_ROOT SOURCE_ROOT PREFIX BINDIR LIBDIR MESON [LOADER_MODULES]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import libloom_check  # noqa: E402

MODEL = os.environ.get("LOOM_MODEL") or os.path.expanduser(
    "~/.cache/loom/SmolLM2-135M-Instruct.Q4_1.gguf")

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def run(cmd, env, **kw):
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, **kw)


def clean_env(tmp):
    """The environment of a user who set nothing: no LOOM_*_PATH, an empty
    per-user folder."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LOOM_") and k not in ("LD_LIBRARY_PATH", "PKG_CONFIG_PATH")}
    env["XDG_DATA_HOME"] = os.path.join(tmp, "xdg")
    return env


def under(path, root):
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root + os.sep)


def dlopened(stderr):
    """Shared objects the dynamic loader opened, from LD_DEBUG=files."""
    files = set()
    for line in stderr.splitlines():
        if "file=" in line and "[0]" in line:
            files.add(line.split("file=", 1)[1].split()[0])
    return files


def installed_run(loom, lib, build, env, tmp):
    listing = run([loom, "backends", "--json"], env)
    check(listing.returncode == 0, "installed loom backends runs: " + listing.stderr[-300:])
    data = json.loads(listing.stdout) if listing.returncode == 0 else {"search_path": [], "backends": []}
    check(not any(under(d, build) for d in data["search_path"]),
          "the installed loom's search path has no build-tree folder: %s" % data["search_path"])
    names = {b["name"]: b["path"] for b in data["backends"] if b["name"]}
    check("ref" in names and "cpu" in names and
          all(under(p, lib) for p in names.values()),
          "ref.so and cpu.so are found in the installed folder: %s" % names)
    if not os.path.exists(MODEL):
        print("note: %s not found, loom run skipped" % MODEL)
        return
    env = dict(env, LD_DEBUG="files")
    gen = run([loom, "run", "-m", MODEL, "-p", "The capital of France is", "-n", "6",
               "--temp", "0", "--no-progress"], env)
    check(gen.returncode == 0 and gen.stdout.strip() != "",
          "installed loom run generates text: %r %s" % (gen.stdout, gen.stderr[-300:]))
    mpi = [f for f in dlopened(gen.stderr) if "libmpi" in f or "/dist/mpi.so" in f]
    check(not mpi, "a single-host loom run loads no MPI (module or libmpi): %s" % mpi)
    plugins = [f for f in dlopened(gen.stderr)
               if f.startswith("/") and ("/loom/" in f or under(f, build))]
    check(plugins and all(under(f, lib) for f in plugins),
          "every plugin loom run loaded is installed: %s" % sorted(plugins))
    check(any(f.endswith("/backends/cpu.so") for f in plugins) and
          any("/quant/" in f for f in plugins),
          "loom run loaded the installed cpu.so and quant plugins")


def build_skeleton(src, tmp, dest, pc_dir, env, meson):
    env = dict(env, PKG_CONFIG_PATH=pc_dir)
    with open(os.path.join(pc_dir, "loom-backend.pc")) as f:
        if "${pcfiledir}" not in f.read():
            # a build dir configured before pkgconfig.relocatable became the
            # default: its .pc names the real prefix, so point at the DESTDIR
            env["PKG_CONFIG_SYSROOT_DIR"] = dest
    cflags = run(["pkg-config", "--cflags", "loom-backend"], env)
    check(cflags.returncode == 0 and tmp in cflags.stdout,
          "pkg-config finds the installed loom-backend.pc: %r" % cflags.stdout)
    skel_src = os.path.join(src, "examples", "backend-skeleton")
    good = os.path.join(tmp, "skeleton-build")
    setup = run([meson, "setup", good, skel_src], env)
    ok = setup.returncode == 0
    if ok:
        ninja = run(["ninja", "-C", good], env)
        ok = ninja.returncode == 0
        setup = ninja
    check(ok, "the skeleton builds out of tree with dependency('loom-backend'): " +
          (setup.stdout + setup.stderr)[-600:])
    bad = os.path.join(tmp, "broken", "skeleton.so")
    os.makedirs(os.path.dirname(bad))
    cc = run(["cc", "-O2", "-shared", "-fPIC", "-fvisibility=hidden",
              "-DSKELETON_BREAK_RMSNORM"] + cflags.stdout.split() +
             [os.path.join(skel_src, "skeleton.c"), "-o", bad, "-lm"], env)
    check(cc.returncode == 0, "the broken skeleton builds with plain cc: " + cc.stderr[-400:])
    return os.path.join(good, "skeleton.so"), bad


def check_backends(loom, good, bad, env, tmp, fakes):
    args = [loom, "check-backend", good]
    if os.path.exists(MODEL):
        args += ["--model", MODEL, "-n", "16"]
    res = run(args, env, timeout=300)
    print(res.stdout[-2500:])
    check(res.returncode == 0 and "skeleton: passed" in res.stdout,
          "the skeleton passes loom check-backend: " + res.stderr[-400:])
    check("inv-gemm" in res.stdout and "invalid" in res.stdout and
          ("e2e" in res.stdout or not os.path.exists(MODEL)),
          "check-backend ran conformance, invalid, invariance (and e2e)")
    res = run([loom, "check-backend", bad], env, timeout=300)
    check(res.returncode != 0 and "rmsnorm" in res.stderr and "FAIL skeleton rmsnorm" in res.stdout,
          "the broken skeleton fails check-backend naming rmsnorm: %s" % res.stderr[-300:])
    check("rope" not in res.stderr, "and names only the broken op: " + res.stderr[-300:])

    # the per-user folder, and refusals with the loader's reasons
    user = os.path.join(tmp, "xdg", "loom", "backends")
    os.makedirs(user)
    shutil.copy(good, user)
    extra = os.path.join(tmp, "extra")
    os.makedirs(extra)
    with open(os.path.join(extra, "junk.so"), "w") as f:
        f.write("not a shared object\n")
    for name in ("abi2.so", "no_attention.so"):
        if fakes and os.path.exists(os.path.join(fakes, name)):
            shutil.copy(os.path.join(fakes, name), extra)
    res = run([loom, "backends"], dict(env, LOOM_BACKEND_PATH=extra))
    out = res.stdout
    print(out)
    check(res.returncode == 0 and os.path.join(user, "skeleton.so") in out,
          "loom backends finds the skeleton in the per-user folder")
    check("junk.so: not an ELF shared object" in out, "a non-ELF file is refused with its reason")
    if fakes:
        check("abi2.so: ABI major 2, this loom needs 1" in out, "an ABI-2 backend is refused")
        check("no_attention.so: required slot attention is missing" in out,
              "a backend missing a slot is refused")


def main():
    if len(sys.argv) < 7:
        print(__doc__)
        return 2
    build, src, prefix, bindir, libdir, meson = sys.argv[1:7]
    fakes = sys.argv[7] if len(sys.argv) > 7 else None
    tmp = tempfile.mkdtemp(prefix="loom-install-")
    try:
        env = clean_env(tmp)
        dest = os.path.join(tmp, "root")
        inst = run([meson, "install", "-C", build, "--destdir", dest, "--no-rebuild",
                    "--quiet"], env)
        check(inst.returncode == 0, "meson install --destdir: " + inst.stderr[-600:])
        if inst.returncode:
            return 1
        root = dest + prefix
        loom = os.path.join(root, bindir, "loom")
        lib = os.path.join(root, libdir, "loom")
        for rel in ("backends/ref.so", "backends/cpu.so", "quant/q4.so", "spec/ngram.so"):
            check(os.path.isfile(os.path.join(lib, rel)), "installed " + rel)
        for rel in ("loom.h", "loom/backend.h", "loom/backend_check.h", "loom/kv_quant.h",
                    "loom/status.h"):
            check(os.path.isfile(os.path.join(root, "include", rel)), "installed include/" + rel)
        for rel in ("share/man/man1/loom.1", "share/bash-completion/completions/loom"):
            check(os.path.isfile(os.path.join(root, rel)), "installed " + rel)
        pc_dir = os.path.join(root, libdir, "pkgconfig")
        check(os.path.isfile(os.path.join(pc_dir, "loom-backend.pc")), "installed loom-backend.pc")
        check(not under(loom, build), "the DESTDIR is outside the build tree")

        installed_run(loom, lib, build, env, tmp)
        libloom_check.check_library(check, root, libdir, tmp)
        libloom_check.check_no_mpi(check, loom, root, libdir)
        embed = libloom_check.build_embed(check, run, src, root, libdir, dest, env, tmp)
        if embed and os.path.exists(MODEL):
            libloom_check.run_embed(check, run, embed, loom, MODEL, root, env)
        good, bad = build_skeleton(src, tmp, dest, pc_dir, env, meson)
        check_backends(loom, good, bad, env, tmp, fakes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
