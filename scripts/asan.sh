#!/usr/bin/env bash
# Builds loom with AddressSanitizer and UndefinedBehaviorSanitizer in a
# build folder of its own and runs the test suite without the GPU
# backends there (docs/TESTING.md).
#
#   scripts/asan.sh [BUILD_DIR] [-- MESON_TEST_ARGS...]
#
# BUILD_DIR defaults to build-asan. Arguments after -- go to `meson test`
# (test names or --suite NAME) to run a part of it; without them every
# suite runs except:
#   gpu      cuda.so and rocm.so are not built here (their device code is
#            not compiled by gcc, so nothing of theirs would be checked, and
#            a CI machine has no device); the emulated backends' loader
#            tests run separately below with the sanitizer runtime preloaded,
#            since they dlopen an instrumented plugin into python (ctypes)
#   fuzz     the libFuzzer harnesses carry ASan and UBSan already (clang)
# and runs dist (under mpirun) after the rest without LeakSanitizer: its
# stop-the-world tracer crashes in a process that has initialised
# OpenMPI 4.1 (seen as "Tracer caught signal 11" and a hang), and what
# OpenMPI leaves allocated at exit comes from components it has unloaded,
# which no suppression can name. ASan and UBSan still check those runs.
# Any sanitizer report fails its test: ASan aborts, UBSan halts on the first
# error, LeakSanitizer checks every process that exits.
set -euo pipefail

cd "$(dirname "$0")/.."
dir=build-asan
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
	dir=$1
	shift
fi
[ "${1:-}" = "--" ] && shift
jobs=${LOOM_JOBS:-2}

if [ ! -d "$dir" ]; then
	meson setup "$dir" -Dbuildtype=debugoptimized -Db_sanitize=address,undefined \
		-Db_lundef=false -Dcuda=disabled -Drocm=disabled -Dfuzz=disabled
fi
ninja -C "$dir" -j "$jobs"

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# libcheck's own per-test timeouts (tests/*/test_*.c), scaled as meson's are
export CK_TIMEOUT_MULTIPLIER=${CK_TIMEOUT_MULTIPLIER:-4}

if [ $# -gt 0 ]; then
	exec meson test -C "$dir" --print-errorlogs --num-processes "$jobs" -t 4 "$@"
fi

rc=0
suites=$(meson test -C "$dir" --list 2>/dev/null | sed -n 's/^loom:\([a-z_0-9]*\) \/ .*/\1/p' | sort -u |
	grep -v -x -e gpu -e fuzz -e dist)
args=()
for s in $suites; do
	args+=(--suite "$s")
done
meson test -C "$dir" --print-errorlogs --num-processes "$jobs" -t 4 "${args[@]}" || rc=1

# dist: mpirun's processes, leak checks off (see the top)
ASAN_OPTIONS=${ASAN_OPTIONS/detect_leaks=1/detect_leaks=0} \
	meson test -C "$dir" --print-errorlogs --num-processes "$jobs" -t 4 --suite dist || rc=1

# The emulated GPU backends: loader tests load the plugin into python with
# ctypes, so python needs the ASan runtime first in the link order; leaks
# are not checked there (python's own allocations would be reported).
libasan=$(cc -print-file-name=libasan.so)
libubsan=$(cc -print-file-name=libubsan.so)
LD_PRELOAD="$libasan $libubsan" ASAN_OPTIONS=abort_on_error=1:detect_leaks=0 \
	meson test -C "$dir" --print-errorlogs --num-processes "$jobs" -t 4 \
	gpu_load_gpuemu gpu_load_gpuemu64 gpu_nodevice_gpuemu gpu_nodevice_gpuemu64 \
	sched_gpuemu sched_swa_gpuemu gpu_e2e_gpuemu gpu_e2e_gpuemu64 || rc=1
exit $rc
