#!/usr/bin/env bash
# plan_vs_measured.sh: `loom plan --cluster local --json` against `loom train`'s measured step time
# (the median of the steps after WARMUP) and peak RSS (rank 0's peak_rss_bytes, which the plan's
# memory_bytes_rank0.total predicts) for configurations that run on this machine: 1-8 ranks; DDP,
# ZeRO 1-3, tp, pp with both schedules, 3D, activation checkpointing, accumulation; tiny, small, gpt2.
# Targets (issue 22): step time within 15%, memory within 10%, for every configuration.
#
# Each configuration is planned right before it runs (the plan measures the machine's load then, so
# other work on a shared machine is in both), then trained on random tokens with one thread per rank.
# Run it under the machine's benchmark lock: flock /tmp/loom-bench.lock bench/plan_vs_measured.sh
#
# usage: bench/plan_vs_measured.sh [STEPS (default 6)]
#   env: LOOM (build/loom), WARMUP (2), ONLY (a regex of configuration names), KEEP=1 keeps the work dir
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-6}
LOOM=${LOOM:-build/loom}
WARMUP=${WARMUP:-2}
ONLY=${ONLY:-.}
PY=/usr/bin/python3

[ -x "$LOOM" ] || { echo "build loom first (make): $LOOM not found" >&2; exit 1; }
WORK=$(mktemp -d /tmp/loom-bench-plan.XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT

# name | model flags | mesh flags (the same for plan and train)
CONFIGS=(
	"tiny-1|--model tiny --batch-size 8 --seq-len 128|"
	"small-1|--model small --batch-size 4 --seq-len 256|"
	"small-accum4|--model small --batch-size 2 --seq-len 256|--grad-accum 4"
	"small-ckpt-blocks|--model small --batch-size 4 --seq-len 256|--activation-checkpointing blocks"
	"small-ddp2|--model small --batch-size 4 --seq-len 256|--nproc 2"
	"small-zero1|--model small --batch-size 4 --seq-len 256|--nproc 2 --zero 1"
	"small-zero2|--model small --batch-size 4 --seq-len 256|--nproc 2 --zero 2"
	"small-zero3|--model small --batch-size 4 --seq-len 256|--nproc 2 --zero 3"
	"small-tp2|--model small --batch-size 4 --seq-len 256|--nproc 2 --tp 2"
	"small-pp2-gpipe|--model small --batch-size 2 --seq-len 256|--nproc 2 --pp 2 --micro-batches 4 --schedule gpipe"
	"small-pp2-1f1b|--model small --batch-size 2 --seq-len 256|--nproc 2 --pp 2 --micro-batches 4 --schedule 1f1b"
	"tiny-3d-8|--model tiny --batch-size 4 --seq-len 128|--nproc 8 --dp 2 --tp 2 --pp 2 --micro-batches 4"
	"tiny-ddp8|--model tiny --batch-size 4 --seq-len 128|--nproc 8"
	"gpt2-1|--model gpt2 --batch-size 1 --seq-len 256|"
)

mkdir -p "$WORK/gpt2" "$WORK/tiny"
$PY bench/random_shard.py "$WORK/gpt2/train_000000.bin" 8 256 400 50257 2 >/dev/null
$PY bench/random_shard.py "$WORK/tiny/train_000000.bin" 8 256 400 257 2 >/dev/null

RESULTS="$WORK/results"
: >"$RESULTS"
for c in "${CONFIGS[@]}"; do
	IFS='|' read -r NAME MODEL MESH <<<"$c"
	[[ "$NAME" =~ $ONLY ]] || continue
	N=$STEPS
	DATA="$WORK/gpt2"
	[[ "$NAME" == tiny* ]] && DATA="$WORK/tiny"
	[[ "$NAME" == gpt2* ]] && N=$((STEPS > 5 ? 5 : STEPS))
	# shellcheck disable=SC2086
	"$LOOM" plan $MODEL $MESH --threads 1 --cluster local --json >"$WORK/$NAME.plan.json"
	# shellcheck disable=SC2086
	if ! "$LOOM" train --train-data "$DATA/train_*.bin" $MODEL $MESH --threads 1 --steps "$N" --lr 1e-4 \
		--log "$WORK/$NAME.jsonl" >"$WORK/$NAME.out" 2>&1; then
		echo "$NAME: loom train failed:" >&2
		tail -5 "$WORK/$NAME.out" >&2
		continue
	fi
	$PY - "$NAME" "$WORK/$NAME.plan.json" "$WORK/$NAME.jsonl" "$WARMUP" "$MESH" >>"$RESULTS" <<'PYEOF'
import json, statistics, sys
name, plan_path, log_path, warmup, mesh = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
plan = json.load(open(plan_path))
rows = [r for r in map(json.loads, open(log_path)) if "step" in r]
dt = statistics.median(r["dt_ms"] for r in rows[warmup:]) / 1e3
rss = max(r["peak_rss_bytes"] for r in rows)
pt, pm = plan["step_time_s"], plan["memory_bytes_rank0"]["total"]
print(f"{name}\t{pt:.3f}\t{dt:.3f}\t{100 * (pt / dt - 1):+.1f}\t{pm / 2**20:.1f}\t{rss / 2**20:.1f}\t"
      f"{100 * (pm / rss - 1):+.1f}\t{plan['cpu_share']:.2f}\t{plan['bubble']:.3f}\t{plan['tokens_per_step'] / dt:.0f}")
PYEOF
	tail -1 "$RESULTS"
done

echo
echo "plan vs measured ($STEPS steps, median after $WARMUP; memory: rank 0's peak RSS; 1 thread per rank)"
$PY - "$RESULTS" <<'PYEOF'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
print("| configuration | plan step s | measured step s | error | plan MiB | measured MiB | error | cpu share | bubble | measured tok/s |")
print("|---|---|---|---|---|---|---|---|---|---|")
ok_t = ok_m = 0
for r in rows:
    print("| " + " | ".join(r) + " |")
    ok_t += abs(float(r[3])) <= 15
    ok_m += abs(float(r[6])) <= 10
print(f"\nstep time within 15%: {ok_t}/{len(rows)}; memory within 10%: {ok_m}/{len(rows)}")
PYEOF

# The search on 2 ranks (small, 2048 tokens per step: dp 2 at B 4, or tp 2 / pp 2 at 2 micro-batches)
# against the measured tokens/s of the 2-rank `small` configurations above.
echo
echo "search: loom plan --model small --batch-size 4 --seq-len 256 --grad-accum 2 --search --ranks 2 --threads 1"
"$LOOM" plan --model small --batch-size 4 --seq-len 256 --grad-accum 2 --search --ranks 2 --threads 1 --top 6 || true
echo "measured, 2-rank small configurations by tokens/s:"
grep -E "^small-(ddp2|zero|tp2|pp2)" "$RESULTS" | sort -t$'\t' -k10 -nr | awk -F'\t' '{printf "  %-18s %s tok/s\n", $1, $10}'
