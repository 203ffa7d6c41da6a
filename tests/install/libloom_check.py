"""The installed libloom, used as a C programmer does (test_install.py runs
these after `meson install --destdir`):

1. libloom.so.0 is installed with SONAME libloom.so.0 (and the libloom.so
   link a linker looks for), and loom.pc says its version and -lloom;
2. the library's dynamic symbols are exactly the functions the installed
   loom.h declares, as GCC itself lists them (-aux-info): no internal
   symbol of the core is exported, and every API function is;
3. examples/embed, copied out of the source tree, builds with its
   Makefile against the installed loom.pc (pkg-config), links
   libloom.so.0, and with the model streams the same greedy text as the
   installed `loom run`, loading libloom and every plugin from the
   installed prefix.
"""
import os
import re
import shutil
import subprocess


def dynamic_needed(path):
    """The NEEDED entries and SONAME of an ELF file (readelf -d)."""
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.*)\]", out)
    soname = re.findall(r"\(SONAME\).*\[(.*)\]", out)
    return needed, soname[0] if soname else None


def exported(path):
    """Names of the defined dynamic symbols, without the version nodes."""
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True,
                         text=True).stdout
    names = set()
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 3 and f[1] != "A":
            names.add(f[2].split("@")[0])
    return names


def declared(header, tmp):
    """The functions a header declares, as the compiler reads it."""
    src, aux = os.path.join(tmp, "decl.c"), os.path.join(tmp, "decl.aux")
    with open(src, "w") as f:
        f.write('#include "%s"\n' % header)
    res = subprocess.run(["gcc", "-fsyntax-only", "-aux-info", aux, src],
                         capture_output=True, text=True)
    if res.returncode:
        return None
    names = set()
    with open(aux) as f:
        for line in f:
            if os.path.basename(header) + ":" in line.split("*/")[0]:
                m = re.search(r"(\w+)\s*\(", line.split("*/", 1)[1])
                if m:
                    names.add(m.group(1))
    return names


def check_library(check, root, libdir, tmp):
    lib = os.path.join(root, libdir)
    so = os.path.join(lib, "libloom.so.0")
    check(os.path.isfile(so) and os.path.islink(os.path.join(lib, "libloom.so")),
          "libloom.so.0 and the libloom.so link are installed")
    if not os.path.isfile(so):
        return
    _, soname = dynamic_needed(so)
    check(soname == "libloom.so.0", "libloom's SONAME is libloom.so.0: %s" % soname)
    api = declared(os.path.join(root, "include", "loom.h"), tmp)
    if api is None:
        print("note: gcc -aux-info unavailable, the export check is skipped")
        return
    names = exported(so)
    check(len(api) > 50 and names == api,
          "libloom exports exactly loom.h's %d functions (extra: %s, missing: %s)" %
          (len(api), sorted(names - api)[:10], sorted(api - names)[:10]))
    check("gguf_open" not in names and "loom_sched_step" not in names,
          "core-internal functions (gguf_open, loom_sched_step) are not exported")


def build_embed(check, run, src, root, libdir, dest, env, tmp):
    pc_dir = os.path.join(root, libdir, "pkgconfig")
    env = dict(env, PKG_CONFIG_PATH=pc_dir)
    with open(os.path.join(pc_dir, "loom.pc")) as f:
        if "${pcfiledir}" not in f.read():
            env["PKG_CONFIG_SYSROOT_DIR"] = dest
    libs = run(["pkg-config", "--libs", "loom"], env)
    check(libs.returncode == 0 and "-lloom" in libs.stdout,
          "pkg-config --libs loom names -lloom: %r %s" % (libs.stdout, libs.stderr[-200:]))
    work = os.path.join(tmp, "embed-src")
    shutil.copytree(os.path.join(src, "examples", "embed"), work)
    res = run(["make", "-C", work], env)
    exe = os.path.join(work, "embed")
    check(res.returncode == 0 and os.path.isfile(exe),
          "examples/embed builds out of tree with pkg-config: " + (res.stdout + res.stderr)[-600:])
    if res.returncode:
        return None
    needed, _ = dynamic_needed(exe)
    check("libloom.so.0" in needed, "embed links libloom.so.0: %s" % needed)
    ldd = run(["ldd", exe], env).stdout
    m = re.search(r"libloom\.so\.0 => (\S+)", ldd)
    check(m and os.path.realpath(m.group(1)).startswith(os.path.realpath(root) + os.sep),
          "embed resolves libloom.so.0 in the installed prefix (the rpath from loom.pc): %s" % ldd)
    return exe


def sanitizer_preload(exe, run, env):
    """A sanitizer build's libloom carries ASan, which must come first in
    a plain program: the runtimes to preload, or None."""
    if "libasan" not in run(["ldd", exe], env).stdout:
        return None
    libs = [run(["cc", "-print-file-name=" + n], env).stdout.strip()
            for n in ("libasan.so", "libubsan.so")]
    return " ".join(libs)


def run_embed(check, run, exe, loom, model, root, env):
    prompt = "The capital of France is"
    ref = run([loom, "run", "-m", model, "-p", prompt, "-n", "8", "--temp", "0",
               "--no-progress"], env)
    run_env = dict(env, LD_DEBUG="files")
    preload = sanitizer_preload(exe, run, env)
    if preload:
        run_env["LD_PRELOAD"] = preload
    res = run([exe, model, prompt, "8"], run_env)
    print(res.stderr[-300:] if res.returncode else "")
    check(res.returncode == 0 and res.stdout == ref.stdout and res.stdout.strip(),
          "embed streams loom run's greedy text: %r vs %r" % (res.stdout, ref.stdout))
    check(re.search(r"generated 8 tokens in [0-9.]+ s", res.stderr) is not None,
          "embed prints its stats: " + res.stderr[-200:])
    loaded = [l.split("file=", 1)[1].split()[0] for l in res.stderr.splitlines()
              if "file=" in l and "[0]" in l]
    ours = [f for f in loaded if "libloom" in f or "/loom/" in f]
    real = os.path.realpath(root)
    check(ours and any("libloom.so" in f for f in ours) and
          all(os.path.realpath(f).startswith(real + os.sep) for f in ours if f.startswith("/")),
          "embed loads libloom and its plugins from the installed prefix: %s" % ours)


def check_no_mpi(check, loom, root, libdir):
    """MPI is a module: neither the loom command, libloom nor an installed
    backend (their collectives find MPI at run time) names libmpi; the
    installed dist/mpi.so does, where the build has MPI."""
    backends = os.path.join(root, libdir, "loom", "backends")
    for path in [loom, os.path.join(root, libdir, "libloom.so.0")] + \
            sorted(os.path.join(backends, f) for f in os.listdir(backends) if f.endswith(".so")):
        needed, _ = dynamic_needed(path)
        check(needed and not any(n.startswith("libmpi") for n in needed),
              "%s does not link libmpi: %s" % (os.path.basename(path), needed))
    module = os.path.join(root, libdir, "loom", "dist", "mpi.so")
    if not os.path.exists(module):
        print("note: no dist/mpi.so installed (a build without MPI)")
        return
    needed, _ = dynamic_needed(module)
    check(any(n.startswith("libmpi") for n in needed),
          "the installed MPI module dist/mpi.so links libmpi: %s" % needed)
