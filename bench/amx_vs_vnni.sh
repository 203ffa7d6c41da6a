#!/usr/bin/env bash
# AMX-INT8 prefill against loom's own VNNI path and llama.cpp (issue 33).
#
#   bench/amx_vs_vnni.sh            on a host with AMX: check, then measure
#
# cpu.so takes AMX tiles only with LOOM_CPU_ISA=amx (opt-in until this has
# passed on an AMX host, docs/BACKENDS.md). This script is what turns that
# into figures, in three steps that each stop it with a reason:
#   1. the CPU lists amx_int8 and amx_tile in /proc/cpuinfo;
#   2. the tile kernels give the VNNI kernel's bits on this CPU: the AMX
#      cases of build/tests/backend/backend_qdot ("amx: N cases, 0 off"),
#      and cpu.so does not fall back ("AMX not used" in loom's log means
#      the kernel refused tile state);
#   3. ROUNDS interleaved rounds, for each file and thread count:
#      loom bench with LOOM_CPU_ISA=amx, loom bench on the default VNNI
#      path, llama-bench; medians over the rounds, the AMX/llama.cpp and
#      AMX/VNNI ratios (the issue asks >= 4x and >= 3x at pp512).
# The 1B-shaped files are bench/vs_llamacpp.sh's (MODEL=1b), made by its
# --setup step when missing.
#
# Environment: LOOM (./build/tools/loom), QUANTS ("Q4_K_M Q4_0 Q8_0"),
# THREADS ("1 2"), ROUNDS (3), PP (512), REPS (3), AMX_ISA (amx; amx-emu
# runs the same steps through the C tile emulation, on any AVX-512 VNNI
# host, to check this script: slow, and its figures mean nothing).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "amx_vs_vnni: $*" >&2; }
die() { log "$*"; exit 1; }

LOOM=${LOOM:-./build/tools/loom}
QUANTS=${QUANTS:-Q4_K_M Q4_0 Q8_0}
THREADS=${THREADS:-1 2}
ROUNDS=${ROUNDS:-3}
PP=${PP:-512}
REPS=${REPS:-3}
QDOT=build/tests/backend/backend_qdot
AMX_ISA=${AMX_ISA:-amx}
case "$AMX_ISA" in amx|amx-emu) ;; *) die "AMX_ISA is amx or amx-emu, not '$AMX_ISA'" ;; esac

case "${1:-}" in
	"") ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument '$1' (try --help)" ;;
esac

# ---------------------------------------------------------------- 1. the CPU
[ "$AMX_ISA" = amx-emu ] || for f in amx_tile amx_int8; do
	grep -qw "$f" /proc/cpuinfo || {
		log "this CPU has no $f ($(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')): nothing to measure"
		exit 0
	}
done

# ---------------------------------------------------------------- 2. bits
[ -x "$LOOM" ] || die "no loom binary at $LOOM (build with meson first, or set LOOM)"
[ -x "$QDOT" ] || die "no $QDOT (build the tests: ninja -C build)"
out=$("$QDOT" 2>&1) || die "backend_qdot failed: $(echo "$out" | tail -5)"
line=$(echo "$out" | grep -E "^$AMX_ISA: " || true)
case "$line" in
	"$AMX_ISA: "*" cases, 0 off") log "tile kernels: $line" ;;
	*) die "the AMX tile kernels were not checked here: ${line:-no '$AMX_ISA:' line from $QDOT}" ;;
esac

MODEL=1b QUANTS="$QUANTS" bash bench/vs_llamacpp.sh --setup >&2
. bench/anchor.sh
BIN=$ANCHOR_BIN
declare -A FILE
for q in $QUANTS; do
	FILE[$q]=$CACHE/models/synthetic-1b.$q.gguf
	[ -s "${FILE[$q]}" ] || die "no ${FILE[$q]} after the setup step"
done
first=${FILE[${QUANTS%% *}]}
note=$(LOOM_CPU_ISA=$AMX_ISA "$LOOM" bench --model "$first" -p 16 -n 1 -t 1 -r 1 2>&1 || true)
if echo "$note" | grep -q "AMX not used"; then
	die "cpu.so fell back to VNNI: $(echo "$note" | grep 'AMX not used')"
fi

# ---------------------------------------------------------------- 3. runs
OUTDIR=$(mktemp -d "${TMPDIR:-/tmp}/amx_vs_vnni.XXXXXX")
log "raw outputs in $OUTDIR"

# the pp column's mean from a loom bench / llama-bench table
pp_of() {
	awk -F'|' -v pp="pp$PP" '
		{ for (i = 2; i < NF; i++) { f = $i; gsub(/^ +| +$/, "", f); if (f == pp) v = $(NF-1) } }
		END { split(v, a, " "); if (a[1] == "") exit 1; print a[1] }' "$1"
}
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR+1)/2]; else print (v[NR/2] + v[NR/2+1]) / 2 }'; }

declare -A AMX VNNI LLAMA
for r in $(seq "$ROUNDS"); do
	for q in $QUANTS; do
		for t in $THREADS; do
			k="$q/$t" f=$OUTDIR/$q.t$t.r$r
			LOOM_CPU_ISA=$AMX_ISA "$LOOM" bench --model "${FILE[$q]}" -p "$PP" -n 0 -t "$t" -r "$REPS" >"$f.amx" 2>&1 ||
				die "loom bench (amx) failed, see $f.amx"
			"$LOOM" bench --model "${FILE[$q]}" -p "$PP" -n 0 -t "$t" -r "$REPS" >"$f.vnni" 2>&1 ||
				die "loom bench (vnni) failed, see $f.vnni"
			"$BIN/llama-bench" -m "${FILE[$q]}" -p "$PP" -n 0 -t "$t" -r "$REPS" >"$f.llama" 2>&1 ||
				die "llama-bench failed, see $f.llama"
			AMX[$k]="${AMX[$k]:-} $(pp_of "$f.amx")"
			VNNI[$k]="${VNNI[$k]:-} $(pp_of "$f.vnni")"
			LLAMA[$k]="${LLAMA[$k]:-} $(pp_of "$f.llama")"
			log "round $r $q t=$t: amx ${AMX[$k]##* } vnni ${VNNI[$k]##* } llama.cpp ${LLAMA[$k]##* }"
		done
	done
done

echo "loom $LOOM, llama.cpp $ANCHOR_VERSION; $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'); medians of $ROUNDS rounds, t/s"
echo "| model (synthetic-1b) | threads | loom AMX pp$PP | loom VNNI pp$PP | llama.cpp pp$PP | AMX / llama.cpp | AMX / VNNI |"
echo "|---|---|---|---|---|---|---|"
for q in $QUANTS; do
	for t in $THREADS; do
		k="$q/$t"
		# shellcheck disable=SC2086
		a=$(median ${AMX[$k]}) v=$(median ${VNNI[$k]}) l=$(median ${LLAMA[$k]})
		awk -v q="$q" -v t="$t" -v a="$a" -v v="$v" -v l="$l" 'BEGIN {
			printf "| %s | %s | %.0f | %.0f | %.0f | %.2f | %.2f |\n", q, t, a, v, l, a / l, a / v }'
	done
done
