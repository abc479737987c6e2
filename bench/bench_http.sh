#!/usr/bin/env bash
# HTTP publish throughput of nsqd: POST /pub and POST /mpub driven by wrk.
#
#   bench/bench_http.sh [--duration 10s] [--connections 32] [--threads 1] [--size 100]
#                       [--batch 100] [--nsqd-bin "python -m nsqpy.nsqd"] [--keep-data]
#                       [--load-tool auto|wrk|python]
#
# Needs wrk (https://github.com/wg/wrk); on Debian/Ubuntu: apt-get install -y wrk. Without
# it (--load-tool auto, the default) bench/_http_load.py, a Python stand-in printing wrk's
# summary lines, drives the load instead, with a warning: its figures are its own ceiling.
#
# Starts a fresh nsqd on 127.0.0.1 port 0 (ours by default; any nsqd binary with
# --nsqd-bin, e.g. a Go nsqd), reads its HTTP port from the "HTTP: listening on"
# log line, creates the topic and a channel first (so messages flow into a channel,
# as in production; nsq's bench.sh creates neither, see spec §11), then runs wrk
# three times: /pub with one --size byte body per request, /mpub with --batch
# newline-separated bodies (text mode), and /mpub?binary=true with the same batch.
# Prints req/s and msgs/s per run, as wrk measured them and as nsqd counted them
# (message_count of the topic in /stats), plus nsqd's CPU time per message.
set -euo pipefail

duration=10s
connections=32
threads=1
size=100
batch=100
keep_data=0
load_tool=auto
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
nsqd_bin="uv run --project $repo --frozen python -m nsqpy.nsqd"

while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration="$2"; shift 2 ;;
    --connections) connections="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --size) size="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --nsqd-bin) nsqd_bin="$2"; shift 2 ;;
    --keep-data) keep_data=1; shift ;;
    --load-tool) load_tool="$2"; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

case "$load_tool" in
  auto) if command -v wrk >/dev/null; then load_tool=wrk; else
          echo "warning: wrk not found (apt-get install -y wrk): bench/_http_load.py drives" \
               "the load instead; its figures are bounded by Python, not by nsqd" >&2
          load_tool=python
        fi ;;
  wrk) command -v wrk >/dev/null || { echo "wrk not found: apt-get install -y wrk" >&2; exit 1; } ;;
  python) ;;
  *) echo "unknown --load-tool: $load_tool (auto, wrk or python)" >&2; exit 2 ;;
esac
command -v curl >/dev/null || { echo "curl not found: apt-get install -y curl" >&2; exit 1; }

work="$(mktemp -d /tmp/nsq-bench-http.XXXXXX)"
nsqd_pid=""
cleanup() {
  if [ -n "$nsqd_pid" ] && kill -0 "$nsqd_pid" 2>/dev/null; then
    kill -TERM "$nsqd_pid"
    wait "$nsqd_pid" 2>/dev/null || true
  fi
  if [ "$keep_data" = 1 ]; then echo "data and logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# -- the request bodies (wrk scripts) --------------------------------------------------------
cat > "$work/pub.lua" <<EOF
wrk.method = "POST"
wrk.body = string.rep("a", $size)
wrk.headers["Content-Type"] = "application/octet-stream"
EOF
cat > "$work/mpub.lua" <<EOF
wrk.method = "POST"
local line = string.rep("a", $size)
local lines = {}
for i = 1, $batch do lines[i] = line end
wrk.body = table.concat(lines, "\n")
wrk.headers["Content-Type"] = "application/octet-stream"
EOF
cat > "$work/mpub_binary.lua" <<EOF
wrk.method = "POST"
local function int32(n)
  return string.char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
                     math.floor(n / 256) % 256, n % 256)
end
local parts = { int32($batch) }
for i = 1, $batch do
  parts[#parts + 1] = int32($size)
  parts[#parts + 1] = string.rep("a", $size)
end
wrk.body = table.concat(parts)
wrk.headers["Content-Type"] = "application/octet-stream"
EOF

# the same bodies as files, for bench/_http_load.py
python3 - "$work" "$size" "$batch" <<'EOF'
import struct, sys
work, size, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
line = b"a" * size
bodies = {
    "pub": line,
    "mpub": b"\n".join([line] * batch),
    "mpub_binary": struct.pack(">i", batch) + (struct.pack(">i", size) + line) * batch,
}
for name, body in bodies.items():
    with open(f"{work}/{name}.body", "wb") as f:
        f.write(body)
EOF

# -- nsqd -----------------------------------------------------------------------------------
mkdir -p "$work/data"
# shellcheck disable=SC2086 # nsqd_bin is a command line
$nsqd_bin --tcp-address=127.0.0.1:0 --http-address=127.0.0.1:0 --https-address= \
  --data-path="$work/data" 2> "$work/nsqd.log" &
nsqd_pid=$!
for _ in $(seq 1 200); do
  if grep -q "HTTP: listening on" "$work/nsqd.log"; then break; fi
  kill -0 "$nsqd_pid" 2>/dev/null || { cat "$work/nsqd.log" >&2; exit 1; }
  sleep 0.05
done
http="$(grep -o 'HTTP: listening on [^ ]*' "$work/nsqd.log" | head -1 | sed 's/HTTP: listening on //')"
[ -n "$http" ] || { echo "nsqd did not log its HTTP address" >&2; cat "$work/nsqd.log" >&2; exit 1; }
# the process that really serves (uv run may sit in between)
server_pid="$(pgrep -P "$nsqd_pid" -f nsqd | head -1 || true)"
server_pid="${server_pid:-$nsqd_pid}"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$server_pid/stat"; }
topic_count() {
  curl -sf "http://$http/stats?format=json&topic=$1&include_clients=false&include_mem=false" |
    python3 -c 'import json,sys; t=json.load(sys.stdin)["topics"]; print(t[0]["message_count"] if t else 0)'
}

echo "nsqd: $nsqd_bin (pid $server_pid) on http://$http"
echo "$load_tool: -t$threads -c$connections -d$duration, body $size bytes, batch $batch"
echo

run() {  # run <name> <lua script> <path and query> <messages per request> <topic>
  local name="$1" script="$2" target="$3" per_request="$4" topic="$5"
  curl -sf -X POST "http://$http/topic/create?topic=$topic" >/dev/null
  curl -sf -X POST "http://$http/channel/create?topic=$topic&channel=bench" >/dev/null
  local before_count before_cpu out rps non2xx count cpu secs
  before_count="$(topic_count "$topic")"
  before_cpu="$(cpu_ticks)"
  local started ended
  started="$(date +%s.%N)"
  if [ "$load_tool" = wrk ]; then
    out="$(wrk -t"$threads" -c"$connections" -d"$duration" --latency -s "$work/$script" \
      "http://$http$target")"
  else
    out="$(python3 "$here/_http_load.py" -t"$threads" -c"$connections" -d"$duration" \
      --body-file "$work/${script%.lua}.body" "http://$http$target")"
  fi
  ended="$(date +%s.%N)"
  count=$(( $(topic_count "$topic") - before_count ))
  cpu=$(( $(cpu_ticks) - before_cpu ))
  rps="$(awk '/^Requests\/sec:/ {print $2}' <<< "$out")"
  non2xx="$(awk '/Non-2xx/ {print $5}' <<< "$out")"
  secs="$(python3 -c "print($ended - $started)")"
  echo "== $name: $load_tool -t$threads -c$connections -d$duration -s $script 'http://$http$target'"
  grep -E "Latency|50%|99%|requests in|Non-2xx|Socket errors" <<< "$out" | sed 's/^/   /'
  python3 - "$rps" "$per_request" "$count" "$secs" "$cpu" "${non2xx:-0}" "$load_tool" <<'EOF'
import os, sys
rps, per, count, secs, ticks, non2xx, tool = sys.argv[1:]
rps, per, count, secs = float(rps), int(per), int(count), float(secs)
cpu = int(ticks) / os.sysconf("SC_CLK_TCK")
print(f"   {rps:,.0f} req/s, {rps * per:,.0f} msgs/s ({tool}); "
      f"nsqd counted {count:,} msgs = {count / secs:,.0f} msgs/s; "
      f"nsqd CPU {cpu:.1f}s = {cpu / max(count, 1) * 1e6:.1f} us/msg; non-2xx: {non2xx}")
EOF
  echo
}

run "PUB" pub.lua "/pub?topic=bench_pub" 1 bench_pub
run "MPUB text" mpub.lua "/mpub?topic=bench_mpub" "$batch" bench_mpub
run "MPUB binary" mpub_binary.lua "/mpub?topic=bench_mpub_bin&binary=true" "$batch" bench_mpub_bin
