#!/usr/bin/env bash
# How loom's decode scales with threads on this machine, and what bounds it
# (issue 12: "2 threads decode at least 1.8x one thread").
#
#   bench/thread_scaling.sh
#
# Decode streams every weight once a token, so it can only go as fast as
# memory delivers them; a second thread helps as much as the memory system
# gives a second core. The script measures both, interleaved in one run:
#   - the streaming-read bandwidth at each thread count (bench/streamread.c);
#   - `loom bench` decode (-p 1 -n TG -r REPS) at each thread count, on the
#     default SmolLM2-135M Q4_1 file (96.6 MB of weights) and on a synthetic
#     model with SmolLM2's layer shapes but 8 layers and an 8192-token
#     vocabulary (tools/mkgguf.py, Q4_1, ~20 MB): small enough that much of
#     it stays in the L3 cache (32 MiB, shared with other tenants here: about
#     12-16 MB of it stays ours, docs/BENCHMARKS.md), so its decode is less
#     bound by DRAM and shows what threads give when the hardware has more to
#     give (and whether per-op hand-offs eat it).
# ROUNDS rounds, each running every case once in turn; it prints medians over
# the rounds and each thread count's ratio to the first (1 thread).
#
# Environment:
#   LOOM       loom binary                    (default ./build/tools/loom)
#   LOOM_FLAGS extra flags for loom bench     (e.g. --backend=/tmp/old/cpu.so)
#   LOOM_CACHE model and probe cache          (default ~/.cache/loom)
#   MODELS     GGUF files to decode           (default the SmolLM2 Q4_1 file
#              and the synthetic one; "synth" names the synthetic one)
#   THREADS    thread counts, the first the base (default "1 2")
#   ROUNDS     interleaved rounds             (default 5)
#   TG, REPS   -n and -r of loom bench        (default 128, 3)
#   DEPTH      -d of loom bench               (default 0)
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "thread_scaling: error: $*" >&2; exit 1; }
log() { echo "thread_scaling: $*" >&2; }

LOOM=${LOOM:-./build/tools/loom}
LOOM_FLAGS=${LOOM_FLAGS:-}
LOOM_CACHE=${LOOM_CACHE:-$HOME/.cache/loom}
THREADS=${THREADS:-1 2}
ROUNDS=${ROUNDS:-5}
TG=${TG:-128}
REPS=${REPS:-3}
DEPTH=${DEPTH:-0}
MODELS=${MODELS:-$LOOM_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf synth}
case "${1:-}" in
	"") ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument '$1' (try --help)" ;;
esac
[ -x "$LOOM" ] || die "no loom binary at $LOOM (build with meson first, or set LOOM)"

STREAM=$(bench/streamread.sh "$LOOM_CACHE") || die "cannot build the bandwidth probe"

# The synthetic model: SmolLM2-135M's layer shapes (576 wide, 1536 FFN, 9
# heads, 3 KV heads), 8 layers, tied 8192-token table, Q4_1.
SYNTH=$LOOM_CACHE/bench/synth-l3-q4_1.gguf
files=()
for m in $MODELS; do
	if [ "$m" = synth ]; then
		if [ ! -s "$SYNTH" ]; then
			python3 -c 'import gguf, numpy' 2>/dev/null ||
				die "the synthetic model needs python3 with gguf and numpy (scripts/setup.sh --test)"
			mkdir -p "$(dirname "$SYNTH")"
			python3 tools/mkgguf.py "$SYNTH.tmp" --layers 8 --embd 576 --ff 1536 \
				--heads 9 --kv-heads 3 --vocab 8192 --type q4_1 --tied -q ||
				die "tools/mkgguf.py failed"
			mv "$SYNTH.tmp" "$SYNTH"
		fi
		m=$SYNTH
	fi
	[ -s "$m" ] || die "no model at $m (run scripts/setup.sh first)"
	files+=("$m")
done

tg_label="tg$TG"
[ "$DEPTH" -gt 0 ] && tg_label="tg$TG @ d$DEPTH"
declare -A TS BW
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq "$ROUNDS"); do
	for t in $THREADS; do
		bw=$("$STREAM" "$t" | cut -d' ' -f1) || die "bandwidth probe failed"
		BW[$t]+="$bw "
	done
	for f in "${files[@]}"; do
		for t in $THREADS; do
			# shellcheck disable=SC2086 # LOOM_FLAGS is a word list
			v=$("$LOOM" bench $LOOM_FLAGS -m "$f" -p 1 -n "$TG" -d "$DEPTH" -r "$REPS" -t "$t" 2>/dev/null |
				awk -F'|' -v l="$tg_label" '{ x = $5; gsub(/^ +| +$/, "", x) } x == l { split($6, a, " "); print a[1] }')
			[ -n "$v" ] || die "loom bench gave no $tg_label row for $f at $t threads"
			TS["$f $t"]+="$v "
		done
	done
	log "round $r of $ROUNDS done"
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
base=${THREADS%% *}
echo "load average before: $LOAD0, after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
printf '| %s |' "what"
for t in $THREADS; do printf ' %s thread(s) |' "$t"; done
for t in $THREADS; do [ "$t" = "$base" ] || printf ' %s / %s |' "$t" "$base"; done
echo
printf '|---|'
for t in $THREADS; do printf -- '---|'; done
for t in $THREADS; do [ "$t" = "$base" ] || printf -- '---|'; done
echo
row() { # label, then the per-thread-count lists in THREADS order via a name prefix
	local label=$1 key=$2 arr=$3 b v
	printf '| %s |' "$label"
	declare -n A=$arr
	for t in $THREADS; do printf ' %s |' "$(echo "${A["$key$t"]}" | median)"; done
	b=$(echo "${A["$key$base"]}" | median)
	for t in $THREADS; do
		[ "$t" = "$base" ] && continue
		v=$(echo "${A["$key$t"]}" | median)
		printf ' %s |' "$(awk -v a="$v" -v b="$b" 'BEGIN { printf "%.2f", a / b }')"
	done
	echo
}
row "streaming read, GB/s" "" BW
for f in "${files[@]}"; do
	mb=$(awk -v b="$(stat -c %s "$f")" 'BEGIN { printf "%.1f", b / 1e6 }')
	row "$(basename "$f") ($mb MB), $tg_label t/s" "$f " TS
done
echo
for t in $THREADS; do echo "raw: streaming read $t thread(s): ${BW[$t]}"; done
for f in "${files[@]}"; do
	for t in $THREADS; do echo "  $(basename "$f") $t thread(s): ${TS["$f $t"]}"; done
done
