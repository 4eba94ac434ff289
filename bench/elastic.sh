#!/bin/sh
# elastic.sh: the time an elastic job takes from the loss of a host to its first step on the hosts
# left, with the in-memory recovery path (--elastic-rescue 1) and from the checkpoint on disk
# (--elastic-rescue 0), alternating (issue 36's benchmark; docs/launcher.md).
#
#   bench/elastic.sh [ROUNDS]      (default 1: one run of each path; root: network namespaces)
#   environment: STEPS=18, LOSE_AT=13 (the host is lost once this step is in the log; checkpoints every
#   SAVE_EVERY=5, so 3 steps after step 10's), LOOM_TIMEOUT_S=10, PATHS="memory checkpoint" (the
#   order within a round), KEEP=1 keeps the work directory
#
# The three-host cluster of scripts/netns-cluster.sh (its own namespaces), one rank per host, `loom
# train --model small` (30M parameters), B 2 x T 64, 768 tokens per step (accumulation 2 at dp 3, 3 at
# dp 2), on a byte-level token set made from docs/*.md. Host 2 is lost by stopping its processes and
# taking its link down once step LOSE_AT is in the log, and does not return; the job ends on two hosts.
# One row per run: the path, the seconds from the loss to the first step logged after the event row,
# the event row's recovery, resumed_from and steps_lost. Run it alone, under loom-quiet.
set -eu
cd "$(dirname "$0")/.."
make -s build/loom
ROUNDS=${1:-1}
STEPS=${STEPS:-18}
LOSE_AT=${LOSE_AT:-13}
SAVE_EVERY=${SAVE_EVERY:-5}
export LOOM_TIMEOUT_S=${LOOM_TIMEOUT_S:-10}
LOOM=$(pwd)/build/loom
CL=$(pwd)/scripts/netns-cluster.sh
P=lb$(($$ % 100000))
export LOOM_NETNS_PREFIX=$P LOOM_NETNS_HOSTS=3
W=$(mktemp -d /tmp/loom-elastic-bench.XXXXXX)
cleanup() {
	for h in 0 1 2; do ip netns pids "$P$h" 2>/dev/null | xargs -r kill -CONT 2>/dev/null || true; done
	for h in 0 1 2; do ip netns pids "$P$h" 2>/dev/null | xargs -r kill -9 2>/dev/null || true; done
	"$CL" down
	rm -f /dev/shm/vader_segment."$P"*
	rm -rf /dev/shm/loom-rescue-"$P"-*
	[ "${KEEP:-0}" = 1 ] || rm -rf "$W"
}
trap cleanup EXIT
cat docs/*.md > "$W/text.txt"
"$LOOM" data prepare --input "$W/text.txt" --out "$W/data" --val-fraction 0 > "$W/prepare.txt" 2>&1 ||
	{ cat "$W/prepare.txt"; exit 1; }
seq 1 3 | sed 's/^/10.231.7./' > "$W/hosts"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
printf '%-10s %10s %-11s %12s %10s\n' path loss_to_s recovery resumed_from steps_lost
run() { # $1: memory|checkpoint, $2: the run's number
	path=$1
	d="$W/$path.$2"
	mkdir -p "$d"
	"$CL" up
	rescue=1
	[ "$path" = checkpoint ] && rescue=0
	(
		cd "$d"
		LOOM_JOB_ID="$P-$path-$2" LOOM_MPIRUN="$CL mpirun" LOOM_ELASTIC_PROBE_S=2 OMP_NUM_THREADS=1 \
			timeout 600 "$LOOM" run --nnodes 2:3 --hostfile "$W/hosts" --nproc-per-node 1 --elastic-dir "$d/ed" \
			--elastic-rescue $rescue "$LOOM" train --train-data "$W/data/train_*.bin" --model small --batch-size 2 \
			--seq-len 64 --total-batch-size 768 --steps "$STEPS" --save-every "$SAVE_EVERY" --keep-checkpoints 2 \
			--resume --save-dir "$d/ck" --log "$d/log.jsonl" --threads 1 --peak-flops 1e11 > "$d/out.txt" 2>&1
	) &
	job=$!
	until grep -q "^{\"step\":$LOSE_AT," "$d/log.jsonl" 2>/dev/null; do sleep 0.05; done
	ip netns pids "${P}2" | xargs -r kill -STOP
	ip -n "${P}2" link set "${P}e2" down
	t0=$(date +%s.%N)
	until awk '/"event"/{e=1} e && /^[{]"step":/{f=1} END{exit !f}' "$d/log.jsonl"; do sleep 0.02; done
	t1=$(date +%s.%N)
	wait $job || { echo "the $path run failed:"; tail -30 "$d/out.txt"; exit 1; }
	row=$(grep '"event":"elastic"' "$d/log.jsonl" | head -1)
	rec=$(echo "$row" | sed 's/.*"recovery":"\([a-z]*\)".*/\1/')
	res=$(echo "$row" | sed 's/.*"resumed_from":\([0-9]*\).*/\1/')
	lost=$(echo "$row" | sed 's/.*"steps_lost":\([0-9]*\).*/\1/')
	printf '%-10s %10.1f %-11s %12s %10s\n' "$path" "$(awk "BEGIN{print $t1 - $t0}")" "$rec" "$res" "$lost"
	for h in 0 1 2; do ip netns pids "$P$h" 2>/dev/null | xargs -r kill -CONT 2>/dev/null || true; done
	for h in 0 1 2; do ip netns pids "$P$h" 2>/dev/null | xargs -r kill -9 2>/dev/null || true; done
	"$CL" down
	left=$(ls -d /dev/shm/loom-rescue-"$P-$path-$2" 2>/dev/null || true)
	[ -z "$left" ] || echo "  left in /dev/shm: $left"
}
i=1
while [ "$i" -le "$ROUNDS" ]; do
	for path in ${PATHS:-memory checkpoint}; do
		run "$path" "$i"
	done
	i=$((i + 1))
done
