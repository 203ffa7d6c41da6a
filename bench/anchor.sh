# The llama.cpp anchor, shared by the bench/ scripts (source it, do not run it).
#
# llama.cpp as vendored in the PyPI sdist llama-cpp-python==$ANCHOR_VERSION,
# built once (CPU only, -DGGML_NATIVE=ON, static) into a cache outside the
# repo. Scripts ask for the targets they need:
#
#   . bench/anchor.sh
#   anchor_build llama-bench llama-quantize     # builds only what is missing
#   "$ANCHOR_BIN/llama-bench" ...
#
# Several sessions may share the cache at once: extraction, configuration and
# building happen under an exclusive flock on $LOOM_CACHE/anchor.lock, and a
# target someone else built while we waited is not built again. Every caller
# configures with the same options (tools and server on), so one caller's
# reconfiguration never removes another's target.
#
# Environment:
#   LOOM_CACHE  model cache    (default ~/.cache/loom)
#   CACHE       anchor cache   (default $LOOM_CACHE/llama.cpp-$ANCHOR_VERSION)
#   JOBS        build jobs     (default nproc)
#
# The caller provides die() and log().

ANCHOR_VERSION=0.3.36
LOOM_CACHE=${LOOM_CACHE:-$HOME/.cache/loom}
CACHE=${CACHE:-$LOOM_CACHE/llama.cpp-$ANCHOR_VERSION}
ANCHOR_BIN=$CACHE/build/bin
ANCHOR_LOCK=$LOOM_CACHE/anchor.lock
JOBS=${JOBS:-$(nproc)}

# anchor_have TARGET...: true when every target's binary is in $ANCHOR_BIN.
anchor_have() {
	local t
	for t in "$@"; do [ -x "$ANCHOR_BIN/$t" ] || return 1; done
}

# The sdist, downloaded once; its vendor/llama.cpp extracted once. Call with
# the lock held.
anchor_source() {
	mkdir -p "$CACHE/pkg" || die "cannot create $CACHE"
	local sdist=$CACHE/pkg/llama_cpp_python-$ANCHOR_VERSION.tar.gz
	if [ ! -s "$sdist" ]; then
		log "downloading the llama-cpp-python==$ANCHOR_VERSION sdist into $CACHE/pkg"
		# --no-binary names the package only: with :all: pip would also
		# build every build dependency (scikit-build-core, ...) from source
		# to prepare the sdist's metadata, which takes many minutes.
		python3 -m pip download -q --no-deps --no-binary llama-cpp-python \
			"llama-cpp-python==$ANCHOR_VERSION" -d "$CACHE/pkg" ||
			die "pip download of llama-cpp-python==$ANCHOR_VERSION failed"
		[ -s "$sdist" ] || die "pip download did not leave $sdist"
	fi
	ANCHOR_SRC=$CACHE/src/llama_cpp_python-$ANCHOR_VERSION/vendor/llama.cpp
	if [ ! -f "$ANCHOR_SRC/CMakeLists.txt" ]; then
		log "extracting $sdist"
		rm -rf "$CACHE/src" && mkdir -p "$CACHE/src"
		tar -xzf "$sdist" -C "$CACHE/src" || die "cannot extract $sdist"
		[ -f "$ANCHOR_SRC/CMakeLists.txt" ] || die "no vendor/llama.cpp in $sdist"
	fi
}

# Configure (when not yet configured with these options) and build the given
# targets. Call with the lock held.
anchor_cmake() {
	command -v cmake >/dev/null || die "cmake not found (apt-get install cmake)"
	# LLAMA_CURL is deprecated in this llama.cpp (a warning, no effect); kept
	# as asked by issue 12. Static libraries: the binaries stand alone. The
	# options are the same for every caller; a stamp records them so that a
	# build directory configured otherwise is configured again.
	local opts=(-DCMAKE_BUILD_TYPE=Release
		-DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
		-DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF
		-DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON
		-DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF)
	# On a CPU with AMX, -march=native lets ggml compile its AMX kernels,
	# and this llama.cpp's llama-bench then dies of SIGILL (a tilezero on
	# a thread that never asked the kernel for tile state; AMX itself
	# works here). Built without AMX, as it is on the CPUs without it.
	if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
		local noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
		opts+=("-DCMAKE_C_FLAGS=$noamx" "-DCMAKE_CXX_FLAGS=$noamx")
	fi
	local stamp=$CACHE/build/.loom-options
	if [ ! -f "$CACHE/build/CMakeCache.txt" ] || [ "$(cat "$stamp" 2>/dev/null)" != "${opts[*]}" ]; then
		log "configuring llama.cpp (CPU only, native) in $CACHE/build"
		cmake -S "$ANCHOR_SRC" -B "$CACHE/build" "${opts[@]}" \
			>"$CACHE/cmake-configure.log" 2>&1 ||
			die "cmake configure failed, see $CACHE/cmake-configure.log"
		echo "${opts[*]}" >"$stamp"
	fi
	log "building $* with $JOBS jobs (several minutes on 2 cores)"
	cmake --build "$CACHE/build" -j "$JOBS" --target "$@" \
		>"$CACHE/cmake-build.$$.log" 2>&1 ||
		die "cmake build failed, see $CACHE/cmake-build.$$.log"
	rm -f "$CACHE/cmake-build.$$.log"
}

# anchor_build TARGET...: make sure the targets' binaries exist.
anchor_build() {
	if anchor_have "$@"; then
		log "llama.cpp $ANCHOR_VERSION: $* found in $ANCHOR_BIN"
		return 0
	fi
	command -v flock >/dev/null || die "flock not found (util-linux)"
	mkdir -p "$LOOM_CACHE" || die "cannot create $LOOM_CACHE"
	log "waiting for $ANCHOR_LOCK"
	(
		flock 9 || die "cannot lock $ANCHOR_LOCK"
		# Someone may have built them while we waited.
		anchor_have "$@" && exit 0
		anchor_source
		local missing=() t
		for t in "$@"; do anchor_have "$t" || missing+=("$t"); done
		anchor_cmake "${missing[@]}"
	) 9>"$ANCHOR_LOCK" || exit 1
	anchor_have "$@" || die "build finished but $* are not all in $ANCHOR_BIN"
}
