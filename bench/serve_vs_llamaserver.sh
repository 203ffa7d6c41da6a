#!/usr/bin/env bash
# loom serve vs llama-server: serving throughput and TTFT (issue 16).
#
#   bench/serve_vs_llamaserver.sh            build the anchor if needed, then measure
#   bench/serve_vs_llamaserver.sh --setup    only build llama-server
#   bench/serve_vs_llamaserver.sh --long     4x the requests per level, 3 rounds
#
# Both servers run the same GGUF with the same threads and the same number of
# parallel sequences (slots), continuous batching and prompt caching on, each
# with the chat template from the model file. bench/loadgen.py sends the same
# streaming /v1/chat/completions requests to each (12 prompts of 3 to ~400
# tokens, temperature 0, max_tokens $MAX_TOKENS) at each client count, loom and
# llama-server in turn at every level, ROUNDS times over (the order of the
# two swapped every other round). Before the first round each server gets the
# 12 prompts once, unmeasured, so both start with a warm prompt cache.
#
# Table: per client count, generated tokens/s of each (median over rounds;
# the level's generated tokens over its wall time), their ratio, and TTFT
# (request sent to first content delta) p50/p99 over all requests of all
# rounds. Both servers stop at EOS, so their outputs may differ in length:
# the table counts what each generated (usage.completion_tokens).
#
# llama.cpp is the one vendored in the PyPI sdist llama-cpp-python==0.3.36,
# built once into a cache outside the repo (bench/anchor.sh).
#
# Environment:
#   LOOM        loom binary                         (default ./build/tools/loom)
#   LOOM_FLAGS  extra flags for loom serve          (e.g. "--exact")
#   LLAMA_FLAGS extra flags for llama-server
#   MODEL       GGUF      (default $LOOM_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf)
#   THREADS     threads of both servers             (default 2)
#   PARALLEL    slots / parallel sequences of both  (default 16)
#   CTX         context per slot                    (default 1024)
#   LEVELS      client counts                       (default "1 4 16 64")
#   REQUESTS    requests per level at least         (default 16; --long: 64)
#   PER_CLIENT  requests per client at least        (default 2)
#   MAX_TOKENS  max_tokens of every request         (default 64)
#   ROUNDS      interleaved rounds                  (default 2; --long: 3)
#   WARMUP      unmeasured requests first, each     (default 12: every prompt once)
#   PORT        first of two ports                  (default 8391)
#   OUTDIR      raw outputs                         (default a new /tmp dir)
# The environment reaches both servers: LOOM_CPU_INVARIANT=0 runs loom
# without batch invariance; on a machine loaded by other work,
# OMP_WAIT_POLICY=PASSIVE keeps llama-server's OpenMP threads from spinning
# at each barrier, without which it collapses (docs/BENCHMARKS.md).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "serve_vs_llamaserver: error: $*" >&2; exit 1; }
log() { echo "serve_vs_llamaserver: $*" >&2; }

. bench/anchor.sh
. bench/serve_lib.sh

LONG=0 SETUP_ONLY=0
case "${1:-}" in
	--setup) SETUP_ONLY=1 ;;
	--long) LONG=1 ;;
	"") ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument '$1' (try --help)" ;;
esac

LOOM=${LOOM:-./build/tools/loom}
LOOM_FLAGS=${LOOM_FLAGS:-}
LLAMA_FLAGS=${LLAMA_FLAGS:-}
MODEL=${MODEL:-$LOOM_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${THREADS:-2}
PARALLEL=${PARALLEL:-16}
CTX=${CTX:-1024}
LEVELS=${LEVELS:-1 4 16 64}
if [ "$LONG" = 1 ]; then
	REQUESTS=${REQUESTS:-64}
	ROUNDS=${ROUNDS:-3}
else
	REQUESTS=${REQUESTS:-16}
	ROUNDS=${ROUNDS:-2}
fi
PER_CLIENT=${PER_CLIENT:-2}
MAX_TOKENS=${MAX_TOKENS:-64}
PORT=${PORT:-8391}
WARMUP=${WARMUP:-12}

anchor_build llama-server
[ "$SETUP_ONLY" = 1 ] && { log "setup done: $ANCHOR_BIN/llama-server"; exit 0; }

[ -x "$LOOM" ] || die "no loom binary at $LOOM (build with meson first, or set LOOM)"
[ -s "$MODEL" ] || die "no model at $MODEL (run scripts/setup.sh first)"
OUTDIR=${OUTDIR:-$(mktemp -d "${TMPDIR:-/tmp}/serve_vs_llamaserver.XXXXXX")}
mkdir -p "$OUTDIR"
log "raw outputs in $OUTDIR"

# ---------------------------------------------------------------- servers
LOOM_PORT=$PORT
LLAMA_PORT=$((PORT + 1))
PIDS=()
stop_servers() {
	local p _
	[ -n "${LOADGEN:-}" ] && kill "$LOADGEN" 2>/dev/null
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	# llama-server finishes its running slots first: 10 s, then KILL
	for _ in $(seq 1 50); do
		for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && break; p=; done
		[ -z "$p" ] && break
		sleep 0.2
	done
	for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
	for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
	PIDS=()
}
trap stop_servers EXIT
trap 'exit 130' INT TERM

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

for p in "$LOOM_PORT" "$LLAMA_PORT"; do
	port_free "$p" || die "port $p is in use (set PORT)"
done

# Slots: loom --parallel and llama-server -np, the same number. llama-server's
# -c is the whole KV cache, shared by the slots (-kvu), as loom's block pool
# is; loom's -c is per sequence.
# shellcheck disable=SC2086
"$LOOM" serve --model "$MODEL" --host 127.0.0.1 --port "$LOOM_PORT" \
	-t "$THREADS" --parallel "$PARALLEL" -c "$CTX" --max-waiting 1024 \
	$LOOM_FLAGS >"$OUTDIR/loom.log" 2>&1 &
PIDS+=($!)
wait_ready "loom serve" "$LOOM_PORT" "${PIDS[-1]}" "$OUTDIR/loom.log"
# shellcheck disable=SC2086
"$ANCHOR_BIN/llama-server" -m "$MODEL" --host 127.0.0.1 --port "$LLAMA_PORT" \
	-t "$THREADS" -tb "$THREADS" -np "$PARALLEL" -c $((PARALLEL * CTX)) -kvu \
	-cb --no-webui $LLAMA_FLAGS >"$OUTDIR/llama.log" 2>&1 &
PIDS+=($!)
wait_ready "llama-server" "$LLAMA_PORT" "${PIDS[-1]}" "$OUTDIR/llama.log"
log "loom serve on :$LOOM_PORT, llama-server on :$LLAMA_PORT ($PARALLEL slots, $THREADS threads each)"

# ---------------------------------------------------------------- runs
# In the background, waited for, so that a signal stops the script at once.
loadgen() { # loadgen PORT JSON ARGS...
	local port=$1 json=$2 rc=0
	shift 2
	python3 bench/loadgen.py --port "$port" --max-tokens "$MAX_TOKENS" \
		--json "$json" "$@" &
	LOADGEN=$!
	wait "$LOADGEN" || rc=$?
	LOADGEN=
	return "$rc"
}

# Warm both prompt caches with the workload's 12 prompts, one at a time.
for s in loom llama; do
	port=$LOOM_PORT; [ "$s" = llama ] && port=$LLAMA_PORT
	loadgen "$port" "$OUTDIR/$s.warmup.json" --concurrency 1 --requests 1 \
		--warmup "$WARMUP" >"$OUTDIR/$s.warmup.out" 2>&1 ||
		die "$s warm-up failed, see $OUTDIR/$s.warmup.out"
done

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
T0=$(date +%s)
for r in $(seq 1 "$ROUNDS"); do
	order="loom llama"
	[ $((r % 2)) = 0 ] && order="llama loom"
	for c in $LEVELS; do
		m=$(( (REQUESTS + c - 1) / c ))
		[ "$m" -lt "$PER_CLIENT" ] && m=$PER_CLIENT
		for s in $order; do
			port=$LOOM_PORT; [ "$s" = llama ] && port=$LLAMA_PORT
			f=$OUTDIR/$s.c$c.r$r
			# A level with failed requests is kept (the table counts them).
			loadgen "$port" "$f.json" --concurrency "$c" --requests "$m" \
				--warmup 0 >"$f.out" 2>&1 || [ -s "$f.json" ] ||
				die "loadgen failed against $s, see $f.out"
			log "round $r, $c clients x $m: $s $(python3 -c '
import json, sys
x = json.load(open(sys.argv[1]))[0]
print("%.1f tok/s, TTFT p50 %s p99 %s ms, %d errors" % (x["tok_s"],
      x["ttft_p50_ms"], x["ttft_p99_ms"], x["errors"]))' "$f.json")"
		done
	done
done
T1=$(date +%s)

# ---------------------------------------------------------------- table
echo
echo "loom serve ($LOOM ${LOOM_FLAGS:-default flags}) vs llama-server (llama.cpp $ANCHOR_VERSION, PyPI llama-cpp-python sdist${LLAMA_FLAGS:+, $LLAMA_FLAGS})"
echo "model $(basename "$MODEL"), $THREADS threads, $PARALLEL slots each, max_tokens $MAX_TOKENS, temperature 0, streaming chat"
echo "$(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p' | head -1); load average before the runs: $LOAD0, after: $(cut -d' ' -f1-3 /proc/loadavg); $((T1 - T0)) s of runs"
echo "environment: OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-(unset)}, LOOM_CPU_INVARIANT=${LOOM_CPU_INVARIANT:-(unset)}"
echo "tok/s: median over $ROUNDS interleaved rounds; TTFT: percentiles over every request of all rounds"
echo
# shellcheck disable=SC2086
python3 - "$OUTDIR" "$ROUNDS" $LEVELS <<'PY'
import json, sys

outdir, rounds, levels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]


def pct(v, p):
    if not v:
        return None
    v = sorted(v)
    return v[max(0, min(len(v) - 1, -(-p * len(v) // 100) - 1))]


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def level(s, c):
    rows = [json.load(open(f"{outdir}/{s}.c{c}.r{r}.json"))[0]
            for r in range(1, rounds + 1)]
    ttft = [t for x in rows for t in x["ttft_s_each"]]
    return {
        "tok_s": median([x["tok_s"] for x in rows]),
        "p50": pct(ttft, 50), "p99": pct(ttft, 99),
        "req": sum(x["requests"] for x in rows),
        "err": sum(x["errors"] for x in rows),
        "tok": sum(x["tokens"] for x in rows),
    }


ms = lambda v: "-" if v is None else f"{v * 1000:.0f}"  # noqa: E731
print("| clients | requests | loom tok/s | llama-server tok/s | ratio "
      "| loom TTFT p50 / p99 ms | llama-server TTFT p50 / p99 ms "
      "| gen tokens loom / llama-server | errors |")
print("|---|---|---|---|---|---|---|---|---|")
for c in levels:
    a, b = level("loom", c), level("llama", c)
    ratio = a["tok_s"] / b["tok_s"] if b["tok_s"] else float("nan")
    print(f"| {c} | {a['req']} | {a['tok_s']:.1f} | {b['tok_s']:.1f} "
          f"| {ratio:.2f} | {ms(a['p50'])} / {ms(a['p99'])} "
          f"| {ms(b['p50'])} / {ms(b['p99'])} | {a['tok']} / {b['tok']} "
          f"| {a['err']} / {b['err']} |")
PY
