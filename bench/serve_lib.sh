# Shared by the serving benchmarks (sourced; the caller defines die()).

# wait_ready NAME PORT PID LOG: until GET /health answers 200 (loom serve
# and llama-server answer 503 while the model loads); dies if PID exits.
wait_ready() {
	local _
	for _ in $(seq 1 600); do
		kill -0 "$3" 2>/dev/null || die "$1 exited while starting, see $4"
		if python3 - "$2" <<'PY' 2>/dev/null
import http.client, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=2)
c.request("GET", "/health")
sys.exit(0 if c.getresponse().status == 200 else 1)
PY
		then
			return 0
		fi
		sleep 0.2
	done
	die "$1 not ready after 600 tries, see $4"
}
