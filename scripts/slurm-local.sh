#!/usr/bin/env bash
# Brings up a one-host Slurm cluster (munged, slurmctld and four slurmd
# named node1..node4, all on this machine) and runs every example in
# examples/slurm to completion with small sizes, then tears it all down.
#
#   sudo ./scripts/slurm-local.sh            # or: make slurm
#   EXAMPLES="moe peer" ./scripts/slurm-local.sh
#
# Root only (Slurm runs jobs as root here; slurmd needs it): as another user
# it prints "skipped" and exits 0. Installs slurm-wlm and munge with apt-get
# when missing. Everything else lives in a temporary directory: its own
# slurm.conf, munge key and socket, state, spool and logs; client commands
# find the cluster through SLURM_CONF. System services (a system munged or
# slurmd) are neither used nor touched. On exit (or Ctrl-C) it cancels its
# jobs, stops the daemons it started (by PID) and removes the directory.
#
# Environment:
#   EXAMPLES     examples to run, in order (default: local pipeline peer moe)
#   JOB_TIMEOUT  seconds one example may take before it is cancelled (300)
#   PORT_BASE    first of the ports used: slurmctld, then one per slurmd,
#                then the examples' DHT/coordinator port (16817)
#   SKYHIVE      a skyhive binary to use instead of building one
#   KEEP=1       keep the temporary directory (configs, logs, job outputs)
#   HOLD=SECONDS  after the examples, keep the cluster up this long for
#                manual use (it prints the SLURM_CONF to export); Ctrl-C or
#                SIGTERM ends it early
set -euo pipefail

say() { printf 'slurm-local: %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
	say "skipped: needs root (it runs slurmctld, slurmd and munged, and installs slurm-wlm and munge if missing)"
	exit 0
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
EXAMPLES=${EXAMPLES-local pipeline peer moe}
JOB_TIMEOUT=${JOB_TIMEOUT:-300}
PORT_BASE=${PORT_BASE:-16817}
NODES=4
T0=$(date +%s)

# --- packages ---------------------------------------------------------------
missing=()
for p in slurmctld slurmd slurm-client munge; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	say "installing slurm-wlm munge (missing: ${missing[*]})"
	# Keep the packages' own services from starting: this script runs its
	# own daemons with its own configuration. A policy-rc.d already in
	# place (containers have one) is left as it is.
	policy=""
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		policy=/usr/sbin/policy-rc.d
		printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy"
	fi
	rc=0
	log=$(mktemp /tmp/slurm-local-apt.XXXXXX)
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge; } >"$log" 2>&1 || rc=$?
	[ -z "$policy" ] || rm -f "$policy"
	[ "$rc" -eq 0 ] || { tail -n 20 "$log"; rm -f "$log"; say "apt-get install slurm-wlm munge failed ($rc)"; exit 1; }
	rm -f "$log"
fi
for c in munged munge slurmctld slurmd sbatch srun scontrol sinfo squeue scancel; do
	command -v "$c" >/dev/null || { say "$c not found after installing slurm-wlm and munge"; exit 1; }
done
[ -d /usr/share/datasets/fashion-mnist ] || { say "Fashion-MNIST missing: run ./scripts/setup.sh first"; exit 1; }

# Ports: slurmctld, one per slurmd, the examples' port.
ports=$(seq "$PORT_BASE" "$((PORT_BASE + NODES + 1))")
for p in $ports; do
	if ss -Hltn "sport = :$p" | grep -q .; then
		say "port $p is in use: set PORT_BASE to a free range"
		exit 1
	fi
done
CTLD_PORT=$PORT_BASE
EXAMPLE_PORT=$((PORT_BASE + NODES + 1))

# --- teardown ---------------------------------------------------------------
T=$(mktemp -d /tmp/skyhive-slurm.XXXXXX)
chmod 711 "$T" # munged wants every directory above its socket searchable
export SLURM_CONF=$T/etc/slurm.conf
MUNGED_PID="" CTLD_PID="" SLURMD_PIDS=() HOLD_PID=""

# ours lists the PIDs of processes other than this shell that carry our
# SLURM_CONF in their environment: job scripts, steps and whatever they
# started (slurmstepd itself does not carry it).
ours() {
	local e pid
	for e in /proc/[0-9]*/environ; do
		pid=${e#/proc/}
		pid=${pid%/environ}
		[ "$pid" != $$ ] && [ "$pid" != "$BASHPID" ] && [ "$pid" != "$MUNGED_PID" ] || continue
		{ tr '\0' '\n' <"$e"; } 2>/dev/null | grep -qxF "SLURM_CONF=$SLURM_CONF" && echo "$pid"
	done
	return 0
}

# stop PID...: SIGTERM, then up to 10 s, then SIGKILL.
stop() {
	local pid
	for pid in "$@"; do kill "$pid" 2>/dev/null || true; done
	for _ in $(seq 50); do
		local alive=0
		for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
		[ "$alive" = 0 ] && return 0
		sleep 0.2
	done
	for pid in "$@"; do kill -9 "$pid" 2>/dev/null || true; done
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	set +e
	[ "$rc" -le 128 ] || say "interrupted: cancelling the jobs, stopping the cluster"
	[ -z "$HOLD_PID" ] || kill "$HOLD_PID" 2>/dev/null
	if [ -n "$CTLD_PID" ] && kill -0 "$CTLD_PID" 2>/dev/null; then
		# Cancel whatever is still queued or running (this cluster's jobs
		# only: SLURM_CONF names it) and give the steps time to end.
		scancel --quiet $(squeue -h -o %i 2>/dev/null) 2>/dev/null
		for _ in $(seq 30); do
			[ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
			sleep 1
		done
	fi
	stop "${SLURMD_PIDS[@]}" $CTLD_PID
	# slurmstepd daemonizes away from slurmd; anything of a job still
	# alive carries our SLURM_CONF.
	local left
	left=$(ours)
	if [ -n "$left" ]; then
		say "stopping leftover job processes:"
		ps -o pid=,args= -p "$(echo $left | tr ' ' ,)" | sed 's/^/    /'
		stop $left
	fi
	[ -z "$MUNGED_PID" ] || stop "$MUNGED_PID"
	if [ "${KEEP:-0}" = 1 ]; then
		say "kept $T"
	else
		rm -rf "$T"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- configuration ----------------------------------------------------------
HOST=$(hostname -s)
mkdir -p "$T/etc" "$T/munge" "$T/state" "$T/log" "$T/bin" "$T/jobs"
chmod 711 "$T/munge" # munged wants its socket directory searchable by all
for k in $(seq "$NODES"); do mkdir -p "$T/spool/node$k"; done
dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$T/munge/munge.key"

{
	cat <<EOF
# One-host Slurm cluster of scripts/slurm-local.sh.
ClusterName=skyhive-local
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$T/munge/munge.socket
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool/%n
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd-%n.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$T/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
# Each node claims 8 CPUs (the examples ask for up to 8 per node) on a
# smaller machine: config_overrides keeps such nodes in service.
SlurmdParameters=config_overrides
SlurmdTimeout=60
InactiveLimit=0
KillWait=10
MinJobAge=600
EOF
	for k in $(seq "$NODES"); do
		echo "NodeName=node$k NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((CTLD_PORT + k)) CPUs=8 State=UNKNOWN"
	done
	echo "PartitionName=local Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP"
} >"$SLURM_CONF"

# --- daemons ----------------------------------------------------------------
say "starting munged, slurmctld and $NODES slurmd in $T"
# Each daemon runs in its own session (setsid): a signal to this script's
# process group (Ctrl-C, timeout) reaches only the script, which then
# cancels the jobs before it stops the daemons, in that order.
setsid munged -F --socket="$T/munge/munge.socket" --key-file="$T/munge/munge.key" \
	--pid-file="$T/munge/munged.pid" --log-file="$T/log/munged.log" \
	--seed-file="$T/munge/munged.seed" >>"$T/log/munged.out" 2>&1 &
MUNGED_PID=$!
for _ in $(seq 50); do
	munge -n -S "$T/munge/munge.socket" 2>/dev/null | unmunge -S "$T/munge/munge.socket" >/dev/null 2>&1 && break
	kill -0 "$MUNGED_PID" 2>/dev/null || { cat "$T/log/munged.out" "$T/log/munged.log" 2>/dev/null; say "munged did not start"; exit 1; }
	sleep 0.2
done

setsid slurmctld -D -f "$SLURM_CONF" >>"$T/log/slurmctld.out" 2>&1 &
CTLD_PID=$!
for k in $(seq "$NODES"); do
	setsid slurmd -D -N "node$k" -f "$SLURM_CONF" >>"$T/log/slurmd-node$k.out" 2>&1 &
	SLURMD_PIDS+=($!)
done
up=0
for _ in $(seq 60); do
	idle=$(sinfo -h -N -o '%N %T' 2>/dev/null | grep -c ' idle$' || true)
	[ "$idle" -eq "$NODES" ] && { up=1; break; }
	kill -0 "$CTLD_PID" 2>/dev/null || break
	sleep 1
done
if [ "$up" != 1 ]; then
	sinfo -N 2>&1 || true
	tail -n 20 "$T/log/slurmctld.log" "$T/log"/slurmd-node*.log 2>/dev/null || true
	say "the cluster did not come up"
	exit 1
fi
# setsid execs the daemon (it forks only when it leads a process group,
# which a background job of this script does not): the PIDs are theirs.
for pid in "$MUNGED_PID" "$CTLD_PID" "${SLURMD_PIDS[@]}"; do
	case "$(ps -o comm= -p "$pid")" in munged | slurmctld | slurmd) ;; *) say "PID $pid is not a daemon"; exit 1 ;; esac
done
say "cluster up: $(sinfo -h -o '%P %D nodes %T' | head -n1) ($(($(date +%s) - T0)) s)"

# --- skyhive ----------------------------------------------------------------
if [ -n "${SKYHIVE:-}" ]; then
	[ -x "$SKYHIVE" ] || { say "SKYHIVE=$SKYHIVE is not an executable"; exit 1; }
	say "using $SKYHIVE"
else
	say "building skyhive"
	(cd "$ROOT" && go build -o "$T/bin/skyhive" ./cmd/skyhive)
	say "built ($(($(date +%s) - T0)) s)"
	SKYHIVE=$T/bin/skyhive
fi
export SKYHIVE

# --- examples ---------------------------------------------------------------
# Small sizes: each example is the real one with fewer examples, epochs,
# seconds. Every run binds to loopback (LISTEN_IP, HEAD_IP).
export PORT=$EXAMPLE_PORT HEAD_IP=127.0.0.1 LISTEN_IP=127.0.0.1
declare -A ENV=(
	[local]="EPOCHS=1 LIMIT=6000"
	[pipeline]="EPOCHS=1 LIMIT=8192"
	[peer]="DURATION=20s LIMIT=12000"
	[moe]="EPOCHS=1 LIMIT=4096 EVAL_LIMIT=2000 TRAINERS=2"
)

# check_NAME DIR: does the job directory hold what the example promises?
# Each prints one line (the result) and fails if it is missing.
check_local() {
	grep -h -o 'test accuracy [0-9.]*% after [0-9]* epochs.*' "$1"/skyhive-local-*.out | tail -n1 | grep .
}
check_pipeline() {
	local w=$1/work
	grep -q . "$w/iterations.jsonl" || { echo "no iterations in iterations.jsonl"; return 1; }
	local names
	# The coordinator's table of workers: "worker NAME  slowdown ..."; each
	# worker names itself $(hostname -s)-$SLURM_PROCID, distinct here too.
	names=$(grep -o '^worker [^ ]* *slowdown' "$w/coordinator.log" | awk '{print $2}' | sort -u | wc -l)
	[ "$names" -eq "$NODES" ] || { echo "$names distinct workers joined, want $NODES"; return 1; }
	grep -o 'pipeline: .* test accuracy [0-9.]*%' "$w/coordinator.log" | tail -n1 | grep .
}
check_peer() {
	local w=$1/work n
	n=$(grep -c '"test_accuracy"' "$w/results.jsonl" || true)
	[ "$n" -eq $((NODES * 2)) ] || { echo "$n peer results in results.jsonl, want $((NODES * 2))"; return 1; }
	awk -F'"test_accuracy":' 'NF > 1 { split($2, a, /[,}]/); v = 100 * a[1]; s += v; if (min == "" || v < min) min = v; n++ }
		END { printf "%d peers, test accuracy mean %.2f%%, min %.2f%%\n", n, s / n, min }' "$w/results.jsonl"
}
check_moe() {
	local w=$1/work n
	n=$(grep -l '"test_accuracy"' "$w"/trainer-*.json 2>/dev/null | wc -l)
	[ "$n" -eq "$NODES" ] || { echo "$n trainer results (trainer-K.json), want $NODES"; return 1; }
	n=$(ls "$w"/experts-*.safetensors 2>/dev/null | wc -l)
	[ "$n" -eq "$NODES" ] || { echo "$n expert checkpoints, want $NODES"; return 1; }
	# The first test_accuracy of each file is the result's (the epochs' follow).
	for f in "$w"/trainer-*.json; do grep -m1 -o '"test_accuracy": [0-9.e-]*' "$f"; done |
		awk '{ v = 100 * $2; s += v; if (min == "" || v < min) min = v; n++ }
			END { printf "%d trainers, test accuracy mean %.2f%%, min %.2f%%\n", n, s / n, min }'
}

declare -A RESULT SECONDS_OF
failed=0
for name in $EXAMPLES; do
	script=$ROOT/examples/slurm/$name.sbatch
	[ -f "$script" ] || { say "no example $script"; failed=1; continue; }
	dir=$T/jobs/$name
	mkdir -p "$dir"
	say "running $name.sbatch (${ENV[$name]:-defaults})"
	start=$(date +%s)
	# Submit, then poll the job every second until it ends (sbatch --wait
	# polls at growing intervals and returned up to ~20 s after the job
	# ended). WORKDIR is fixed so that the check knows where to look.
	rc=0
	job=$(cd "$dir" && env ${ENV[$name]:-} WORKDIR="$dir/work" sbatch --parsable "$script" 2>"$dir/sbatch.err" | cut -d';' -f1) || rc=$?
	state=""
	if [ -n "$job" ]; then
		deadline=$((start + JOB_TIMEOUT))
		while :; do
			info=$(scontrol show job -o "$job" 2>/dev/null || true)
			state=$(grep -o 'JobState=[A-Z_]*' <<<"$info" | cut -d= -f2)
			case "$state" in
			PENDING | CONFIGURING | RUNNING | COMPLETING | REQUEUED | RESIZING | SUSPENDED | "") ;;
			*) break ;;
			esac
			if [ "$(date +%s)" -ge "$deadline" ]; then
				scancel "$job" 2>/dev/null || true
				state="TIMEOUT(${JOB_TIMEOUT}s)"
				break
			fi
			sleep 1
		done
		# ExitCode=CODE:SIGNAL of the batch script.
		code=$(grep -o ' ExitCode=[0-9]*:[0-9]*' <<<"$info" | cut -d= -f2)
		[ "$code" = "0:0" ] || rc=${code:-1}
	fi
	secs=$(($(date +%s) - start))
	# The job's own run time, from the job completion log.
	ran=$(grep "^JobId=$job " "$T/log/jobcomp.txt" 2>/dev/null | tail -n1 |
		sed -n 's/.* StartTime=\([^ ]*\) EndTime=\([^ ]*\) .*/\1 \2/p' |
		{ read -r a b && echo $(($(date -d "$b" +%s) - $(date -d "$a" +%s))); } || true)
	if [ "$rc" = 0 ] && [ "$state" = COMPLETED ] && res=$(check_"$name" "$dir" 2>&1); then
		RESULT[$name]="ok: $res"
	else
		res=${res:-}
		RESULT[$name]="FAILED: job ${job:-?} ${state:-?}, exit code $rc${res:+; $res}"
		failed=1
		say "$name failed; the job's output:"
		tail -n 30 "$dir"/*.out "$dir/sbatch.err" 2>/dev/null | sed 's/^/    /' || true
		find "$dir/work" -name '*.log' -exec tail -n 15 {} + 2>/dev/null | sed 's/^/    /' || true
	fi
	unset res
	SECONDS_OF[$name]="$secs s (job ${ran:-?} s)"
	say "$name: ${SECONDS_OF[$name]}, ${RESULT[$name]}"
done

if [ "${HOLD:-0}" -gt 0 ]; then
	say "cluster held for $HOLD s: export SLURM_CONF=$SLURM_CONF SKYHIVE=$SKYHIVE (script PID $$)"
	sleep "$HOLD" &
	HOLD_PID=$!
	wait $HOLD_PID || true
fi

say "summary (total $(($(date +%s) - T0)) s including bring-up and build):"
for name in $EXAMPLES; do
	printf '  %-9s %-18s %s\n' "$name" "${SECONDS_OF[$name]:-?}" "${RESULT[$name]:-not run}"
done
exit "$failed"
