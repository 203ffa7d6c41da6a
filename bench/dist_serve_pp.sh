#!/usr/bin/env bash
# Pipeline micro-batches in `loom serve --pp` (docs/DISTRIBUTED.md,
# "Pipeline overlap"): serving throughput with each step whole against
# split into micro-batches whose stages overlap.
#
#   bench/dist_serve_pp.sh
#
# For each --pp-micro value in MICRO ("auto": the flag left out, the default
# rule), starts
#   mpirun --oversubscribe -np PP loom serve --pp PP -t 1 --pp-micro M
# and has bench/loadgen.py send CLIENTS concurrent clients REQUESTS streaming
# chat requests each (temperature 0, max_tokens MAX_TOKENS), ROUNDS times
# over with the order of the values rotated every round; the server
# restarts for every measurement. Table: per value, the generated tokens/s
# of each round and their median, and the median's ratio to the first
# value's (--pp-micro 1: steps run whole, stages one after another).
#
# Environment:
#   LOOM        loom binary                   (default ./build/tools/loom)
#   LOOM_FLAGS  extra flags for loom serve    (e.g. "--exact")
#   MODEL       GGUF      (default ~/.cache/loom/SmolLM2-135M-Instruct.Q4_1.gguf)
#   PP          pipeline stages (ranks)       (default 2)
#   MICRO       --pp-micro values             (default "1 auto 4"; the first is the baseline)
#   CLIENTS     concurrent clients            (default 8)
#   PARALLEL    server's parallel sequences   (default 16)
#   REQUESTS    requests per client           (default 2)
#   MAX_TOKENS  max_tokens of every request   (default 64)
#   ROUNDS      rounds                        (default 3)
#   PORT        server port                   (default 8395)
#   OUTDIR      raw outputs                   (default a new /tmp dir)
# Each rank should have a core of its own: on a machine with fewer cores
# than PP, or loaded by other work, the figures say little.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "dist_serve_pp: error: $*" >&2; exit 1; }
. bench/serve_lib.sh
log() { echo "dist_serve_pp: $*" >&2; }

case "${1:-}" in
	"") ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument '$1' (try --help)" ;;
esac

LOOM=${LOOM:-./build/tools/loom}
LOOM_FLAGS=${LOOM_FLAGS:-}
MODEL=${MODEL:-$HOME/.cache/loom/SmolLM2-135M-Instruct.Q4_1.gguf}
PP=${PP:-2}
MICRO=${MICRO:-1 auto 4}
CLIENTS=${CLIENTS:-8}
PARALLEL=${PARALLEL:-16}
REQUESTS=${REQUESTS:-2}
MAX_TOKENS=${MAX_TOKENS:-64}
ROUNDS=${ROUNDS:-3}
PORT=${PORT:-8395}

command -v mpirun >/dev/null || die "mpirun not found (apt-get install openmpi-bin)"
[ -x "$LOOM" ] || die "no loom binary at $LOOM (build with meson first, or set LOOM)"
[ -s "$MODEL" ] || die "no model at $MODEL (run scripts/setup.sh first)"
OUTDIR=${OUTDIR:-$(mktemp -d "${TMPDIR:-/tmp}/dist_serve_pp.XXXXXX")}
mkdir -p "$OUTDIR"
log "raw outputs in $OUTDIR"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl_vader_single_copy_mechanism=none

SERVER=
stop_server() {
	[ -n "$SERVER" ] || return 0
	kill -INT "$SERVER" 2>/dev/null || true
	for _ in $(seq 1 100); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.1; done
	kill -9 "$SERVER" 2>/dev/null || true
	wait "$SERVER" 2>/dev/null || true
	SERVER=
}
trap stop_server EXIT
trap 'exit 130' INT TERM

# measure M ROUND: one server, one loadgen level; its tokens/s on stdout.
measure() {
	local name="m$1.r$2" micro=(--pp-micro "$1")
	[ "$1" = auto ] && micro=()
	# shellcheck disable=SC2086
	mpirun --oversubscribe -np "$PP" "$LOOM" serve -m "$MODEL" --pp "$PP" -t 1 \
		"${micro[@]}" --parallel "$PARALLEL" --port "$PORT" $LOOM_FLAGS \
		>"$OUTDIR/$name.server.log" 2>&1 &
	SERVER=$!
	wait_ready "loom serve" "$PORT" "$SERVER" "$OUTDIR/$name.server.log"
	python3 bench/loadgen.py --port "$PORT" --concurrency "$CLIENTS" \
		--requests "$REQUESTS" --max-tokens "$MAX_TOKENS" --warmup 2 \
		--json "$OUTDIR/$name.json" >"$OUTDIR/$name.loadgen.txt" \
		|| die "loadgen failed, see $OUTDIR/$name.loadgen.txt"
	stop_server
	python3 -c 'import json, sys; print("%.2f" % json.load(open(sys.argv[1]))[0]["tok_s"])' \
		"$OUTDIR/$name.json"
}

read -r -a VALUES <<<"$MICRO"
declare -A TOKS
for r in $(seq 1 "$ROUNDS"); do
	n=${#VALUES[@]}
	for i in $(seq 0 $((n - 1))); do
		m=${VALUES[$(((i + r - 1) % n))]}
		t=$(measure "$m" "$r")
		log "round $r, --pp-micro $m: $t tok/s"
		TOKS[$m]="${TOKS[$m]:-} $t"
	done
done

echo "mpirun -np $PP loom serve --pp $PP -t 1 $LOOM_FLAGS, $(basename "$MODEL"), $CLIENTS clients x $REQUESTS requests, max_tokens $MAX_TOKENS"
echo
echo "| --pp-micro | tok/s per round | median tok/s | vs ${VALUES[0]} |"
echo "|---|---|---|---|"
base=
for m in "${VALUES[@]}"; do
	# shellcheck disable=SC2086
	med=$(printf '%s\n' ${TOKS[$m]} | sort -g | awk '{v[NR]=$1} END {print NR % 2 ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}')
	[ -n "$base" ] || base=$med
	echo "| $m |${TOKS[$m]} | $med | $(awk -v a="$med" -v b="$base" 'BEGIN {printf "%.2fx", a / b}') |"
done
