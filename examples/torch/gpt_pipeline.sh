#!/bin/sh
# A GPT split over pipeline workers that compute in PyTorch: a coordinator
# waits for two `skyhive worker --executor python` processes, as it would
# for workers on two other machines (here they join over loopback), profiles
# them, plans, and trains gpt-mini on GCIDE; each worker holds its layers'
# PyTorch twins and their AdamW state on DEVICE.
#
#   examples/torch/gpt_pipeline.sh [STEPS] [DEVICE]     (defaults: 100, auto)
#
# Needs bin/skyhive (make build) or skyhive on PATH, and a python3 with
# torch ($SKYHIVE_PYTHON, e.g. /usr/bin/python3 with Debian's python3-torch).
# On real machines, run the worker line on each of them with the address the
# coordinator prints.
set -eu
steps=${1:-100}
device=${2:-auto}
repo=$(cd "$(dirname "$0")/../.." && pwd)
skyhive=${SKYHIVE_BIN:-$repo/bin/skyhive}
[ -x "$skyhive" ] || skyhive=skyhive
export PYTHONPATH="$repo/python${PYTHONPATH:+:$PYTHONPATH}"
log=$(mktemp)
trap 'kill $coord 2>/dev/null || true; rm -f "$log"' EXIT

"$skyhive" train pipeline --join-wait 2 --listen /ip4/127.0.0.1/tcp/0 --model gpt-mini --data gcide \
	--steps "$steps" --log-every 20 >"$log" 2>&1 &
coord=$!
addr=
for _ in $(seq 120); do # the tokenizer trains first: up to a minute
	addr=$(sed -n 's/^ *skyhive worker --join \([^ ]*\).*/\1/p' "$log" | head -n 1)
	[ -n "$addr" ] && break
	kill -0 $coord 2>/dev/null || { cat "$log"; exit 1; }
	sleep 1
done
[ -n "$addr" ] || { echo "the coordinator printed no address:"; cat "$log"; exit 1; }
for i in 0 1; do
	"$skyhive" worker --join "$addr" --name "torch$i" --executor python --device "$device" &
done
tail -f "$log" --pid=$coord
wait $coord
