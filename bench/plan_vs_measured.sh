#!/usr/bin/env bash
# plan_vs_measured.sh: the planner's prediction against `loom train`'s measurement, on this machine,
# for 36 configurations: both families (GPT-2: tiny, small, gpt2 and a 2-layer model at T 4096;
# nanochat depth 2 and 4), T from 128 to 4096, 1 and 2 threads per rank, 1 to 8 ranks, every strategy
# and mesh (DDP with fp32 and bf16 gradients, ZeRO 1-3, tp with and without sequence parallelism, pp
# with GPipe, 1F1B and the interleaved schedule, 3D), bf16 matmuls, activation checkpointing (blocks,
# selective), MuonAdamW (replicated and under ZeRO), evaluation on and off.
#
# The prediction is the one the trainer prints and logs (the "plan" of its log's config record, which
# is `loom plan --json`'s for the same flags: the "same" column checks it by running `loom plan` with
# the load the trainer measured); measured are the median step after WARMUP steps and rank 0's peak
# resident set (peak_rss_bytes, what the plan's memory_bytes_rank0.total predicts). Targets (issue 34):
# step time within 15%, memory within 10%.
#
# Validation on runs the calibration did not see: the rows are in two halves ("fit" and "check",
# alternating through the list, so each half has every kind of run). Two factors (a for the plan's
# compute span, b for the rest: optimizer and exposed communication) are fit to the fit half (a grid,
# least squared log error), and the check half is reported with them: a factor far from 1 says which
# figures are off (a: the kernels' rates the calibration measured, src/train/plan_calib.c, or with
# nothing measured the constants of src/train/plan_cluster.c; b: the optimizer's rate, the memory
# bandwidth's and the links' figures), and the check half's errors whether that would hold. The
# machine's figures (peaks, the kernels' rates) are measured by the first run that lacks them (docs/
# plan.md, "Calibration"); the JSON's "figures" says which were.
#
# Each configuration trains on random tokens, one thread per rank unless the row says --threads 2.
# Run it under the machine's benchmark lock on a quiet machine (ONLY= splits it into parts):
#   flock /tmp/loom-bench.lock bench/plan_vs_measured.sh
#
# HOLDOUT=1 runs instead 11 configurations that are not in the list above and that no constant of the
# planner was fitted to (other shapes, meshes and options, context parallelism among them): issue 34's
# "runs plan_vs_measured does not contain" (all are reported, fitted or not; the fit is still printed).
#
# usage: bench/plan_vs_measured.sh [STEPS (default 6)]
#   env: LOOM (build/loom), WARMUP (2), ONLY (a regex of configuration names), HOLDOUT (0), KEEP=1 keeps the
#        work dir
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

EVAL="--val-data VAL --eval-every 2 --eval-batches 16"
NC4="--arch nanochat --depth 4 --vocab-size 257"
# name | data (gpt2: 50257 tokens, byte: 257) | model and batch flags | mesh and run flags
CONFIGS=(
	"tiny-1|byte|--model tiny --vocab-size 257 --batch-size 8 --seq-len 128|"
	"tiny-1-t2|byte|--model tiny --vocab-size 257 --batch-size 8 --seq-len 128|--threads 2"
	"small-1|gpt2|--model small --batch-size 4 --seq-len 256|"
	"small-accum4|gpt2|--model small --batch-size 2 --seq-len 256|--grad-accum 4"
	"small-ckpt-blocks|gpt2|--model small --batch-size 4 --seq-len 256|--activation-checkpointing blocks"
	"small-ckpt-selective|gpt2|--model small --batch-size 4 --seq-len 256|--activation-checkpointing selective"
	"small-ddp2|gpt2|--model small --batch-size 4 --seq-len 256|--nproc 2"
	"small-ddp2-bf16grad|gpt2|--model small --batch-size 4 --seq-len 256|--nproc 2 --grad-reduce-dtype bf16"
	"small-zero1|gpt2|--model small --batch-size 4 --seq-len 256|--nproc 2 --zero 1"
	"small-zero2|gpt2|--model small --batch-size 4 --seq-len 256|--nproc 2 --zero 2"
	"small-zero3|gpt2|--model small --batch-size 4 --seq-len 256|--nproc 2 --zero 3"
	"small-tp2|gpt2|--model small --batch-size 4 --seq-len 256|--nproc 2 --tp 2"
	"small-tp2-sp|gpt2|--model small --batch-size 4 --seq-len 256|--nproc 2 --tp 2 --sequence-parallel"
	"small-pp2-gpipe|gpt2|--model small --batch-size 2 --seq-len 256|--nproc 2 --pp 2 --micro-batches 4 --pp-schedule gpipe"
	"small-pp2-1f1b|gpt2|--model small --batch-size 2 --seq-len 256|--nproc 2 --pp 2 --micro-batches 4 --pp-schedule 1f1b"
	"small-pp2-interleaved|gpt2|--model small --batch-size 2 --seq-len 256|--nproc 2 --pp 2 --micro-batches 4 --pp-schedule interleaved --virtual-stages 2"
	"tiny-3d-8|byte|--model tiny --vocab-size 257 --batch-size 4 --seq-len 128|--nproc 8 --dp 2 --tp 2 --pp 2 --micro-batches 4"
	"tiny-ddp8|byte|--model tiny --vocab-size 257 --batch-size 4 --seq-len 128|--nproc 8"
	"small-bf16|gpt2|--model small --batch-size 4 --seq-len 256|--dtype bf16"
	"small-muon|gpt2|--model small --batch-size 4 --seq-len 256|--optimizer muon"
	"small-muon-zero2|gpt2|--model small --batch-size 4 --seq-len 256|--nproc 2 --zero 2 --optimizer muon"
	"small-eval|gpt2|--model small --batch-size 4 --seq-len 256|$EVAL"
	"gpt2-1|gpt2|--model gpt2 --batch-size 1 --seq-len 256|"
	"gpt2-T1024|gpt2|--model gpt2 --batch-size 1 --seq-len 1024|"
	"gpt2fam-T4096|byte|--n-layer 2 --n-head 2 --n-embd 128 --n-positions 4096 --vocab-size 257 --batch-size 1 --seq-len 4096|"
	"nc-d4-T256|byte|$NC4 --batch-size 4 --seq-len 256|"
	"nc-d4-T1024|byte|$NC4 --batch-size 1 --seq-len 1024|"
	"nc-d4-T2048|byte|$NC4 --batch-size 1 --seq-len 2048|"
	"nc-d2-T4096|byte|--arch nanochat --depth 2 --vocab-size 257 --batch-size 1 --seq-len 4096|"
	"nc-d4-t2|byte|$NC4 --batch-size 4 --seq-len 256|--threads 2"
	"nc-d4-ddp2-muon|byte|$NC4 --batch-size 4 --seq-len 256|--nproc 2 --optimizer muon"
	"nc-d4-zero1|byte|$NC4 --batch-size 4 --seq-len 256|--nproc 2 --zero 1"
	"nc-d4-tp2|byte|$NC4 --batch-size 4 --seq-len 256|--nproc 2 --tp 2"
	"nc-d4-pp2|byte|$NC4 --batch-size 2 --seq-len 256|--nproc 2 --pp 2 --micro-batches 4"
	"nc-d4-bf16-ckpt|byte|$NC4 --batch-size 4 --seq-len 256|--dtype bf16 --activation-checkpointing blocks"
	"nc-d4-eval|byte|$NC4 --batch-size 4 --seq-len 256|$EVAL"
)
if [ "${HOLDOUT:-0}" = 1 ]; then
	CONFIGS=(
		"small-T128-B8|gpt2|--model small --batch-size 8 --seq-len 128|"
		"small-ddp2-accum2|gpt2|--model small --batch-size 2 --seq-len 256|--nproc 2 --grad-accum 2"
		"small-zero3-bf16|gpt2|--model small --batch-size 4 --seq-len 256|--nproc 2 --zero 3 --dtype bf16"
		"small-tp2-ckpt|gpt2|--model small --batch-size 4 --seq-len 256|--nproc 2 --tp 2 --activation-checkpointing blocks"
		"small-pp2-eval|gpt2|--model small --batch-size 2 --seq-len 256|--nproc 2 --pp 2 --micro-batches 4 $EVAL"
		"tiny-ddp4|byte|--model tiny --vocab-size 257 --batch-size 4 --seq-len 128|--nproc 4"
		"nc-d2-T1024-B2|byte|--arch nanochat --depth 2 --vocab-size 257 --batch-size 2 --seq-len 1024|"
		"nc-d4-T512-t2|byte|$NC4 --batch-size 2 --seq-len 512|--threads 2"
		"nc-d4-zero2|byte|$NC4 --batch-size 4 --seq-len 256|--nproc 2 --zero 2"
		"nc-d6-T2048|byte|--arch nanochat --depth 6 --vocab-size 257 --batch-size 1 --seq-len 2048|"
		"nc-d4-cp2|byte|$NC4 --batch-size 2 --seq-len 512|--nproc 2 --cp 2"
	)
fi

mkdir -p "$WORK/gpt2" "$WORK/byte"
$PY bench/random_shard.py "$WORK/gpt2/train_000000.bin" 8 256 400 50257 2 >/dev/null
$PY bench/random_shard.py "$WORK/byte/train_000000.bin" 8 256 400 257 2 >/dev/null

RESULTS="$WORK/results"
: >"$RESULTS"
k=0
for c in "${CONFIGS[@]}"; do
	IFS='|' read -r NAME DATA MODEL MESH <<<"$c"
	SET=fit
	[ $((k % 2)) = 1 ] && SET=check
	k=$((k + 1))
	[[ "$NAME" =~ $ONLY ]] || continue
	N=$STEPS
	[[ "$NAME" == gpt2* ]] && N=$((STEPS > 5 ? 5 : STEPS))
	MESH=${MESH//VAL/$WORK/$DATA/train_*.bin}
	THREADS="--threads 1"
	[[ "$MESH" == *--threads* ]] && THREADS=""
	RUN="--train-data $WORK/$DATA/train_*.bin $MODEL $MESH $THREADS --steps $N"
	# shellcheck disable=SC2086
	if ! "$LOOM" train $RUN --lr 1e-4 --log "$WORK/$NAME.jsonl" >"$WORK/$NAME.out" 2>&1; then
		echo "$NAME: loom train failed:" >&2
		tail -5 "$WORK/$NAME.out" >&2
		continue
	fi
	# the same flags through loom plan, at the load the trainer measured: its JSON must be the log's plan
	LOAD=$($PY -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["config"]["plan"]["background_load"])' \
		"$WORK/$NAME.jsonl")
	# shellcheck disable=SC2086
	"$LOOM" plan $RUN --load "$LOAD" --json >"$WORK/$NAME.plan.json"
	$PY - "$NAME" "$SET" "$WORK/$NAME.plan.json" "$WORK/$NAME.jsonl" "$WARMUP" >>"$RESULTS" <<'PYEOF'
import json, statistics, sys
name, part, plan_path, log_path, warmup = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
rows = [json.loads(l) for l in open(log_path)]
plan = rows[0]["config"]["plan"]
same = json.load(open(plan_path)) == plan
steps = [r for r in rows if "step" in r]
dt = statistics.median(r["dt_ms"] for r in steps[warmup:]) / 1e3
rss = max(r["peak_rss_bytes"] for r in steps)
pt, pm = plan["step_time_s"], plan["memory_bytes_rank0"]["total"]
ce = plan["comm_exposed_s"]
rest = plan["optimizer_s"] + ce["dp"] + ce["pp"]  # the compute span is the rest of the step
print("\t".join([name, part, f"{pt:.4f}", f"{dt:.4f}", f"{pt - rest:.4f}", f"{rest:.4f}", f"{pm / 2**20:.1f}",
                 f"{rss / 2**20:.1f}", f"{plan['cpu_share']:.2f}", f"{plan['bubble']:.3f}", "yes" if same else "NO"]))
PYEOF
	tail -1 "$RESULTS"
done

echo
echo "plan vs measured ($STEPS steps, median after $WARMUP; memory: rank 0's peak RSS)"
$PY - "$RESULTS" <<'PYEOF'
import math, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
def err(p, m):
    return 100 * (p / m - 1)
fit = [r for r in rows if r[1] == "fit"]
best = (1.0, 1.0, float("inf"))
for i in range(50, 201):          # a, b in 0.50 .. 2.00: the compute span's and the rest's factors
    for j in range(50, 201, 5):
        a, b = i / 100, j / 100
        sq = sum(math.log((a * float(r[4]) + b * float(r[5])) / float(r[3])) ** 2 for r in fit)
        if sq < best[2]:
            best = (a, b, sq)
a, b = best[0], best[1]
print("| configuration | half | plan step s | measured step s | error | refit error | plan MiB | measured MiB | error "
      "| cpu share | bubble | = loom plan |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
ok_t = ok_m = ok_c = n_c = ok_same = 0
for r in rows:
    p, m, pm, mm = float(r[2]), float(r[3]), float(r[6]), float(r[7])
    refit = a * float(r[4]) + b * float(r[5])
    print(f"| {r[0]} | {r[1]} | {p:.3f} | {m:.3f} | {err(p, m):+.1f}% | {err(refit, m):+.1f}% | {pm:.1f} | {mm:.1f} "
          f"| {err(pm, mm):+.1f}% | {r[8]} | {r[9]} | {r[10]} |")
    ok_t += abs(err(p, m)) <= 15
    ok_m += abs(err(pm, mm)) <= 10
    ok_same += r[10] == "yes"
    if r[1] == "check":
        n_c += 1
        ok_c += abs(err(refit, m)) <= 15
print(f"\nstep time within 15%: {ok_t}/{len(rows)}; memory within 10%: {ok_m}/{len(rows)}; "
      f"the trainer's plan is loom plan's: {ok_same}/{len(rows)}")
print(f"fit on the {len(fit)} 'fit' rows: compute span x {a:.2f}, optimizer and exposed communication x {b:.2f}; "
      f"with them the {n_c} 'check' rows (not fitted) within 15%: {ok_c}/{n_c}")
PYEOF

# The search on 2 ranks (small, 2048 tokens per step: dp 2 at B 4, or tp 2 / pp 2 at 2 micro-batches)
# against the measured tokens/s of the 2-rank `small` configurations above.
echo
echo "search: loom plan --model small --batch-size 4 --seq-len 256 --grad-accum 2 --search --ranks 2 --threads 1"
"$LOOM" plan --model small --batch-size 4 --seq-len 256 --grad-accum 2 --search --ranks 2 --threads 1 --top 6 || true
echo "measured, 2-rank small configurations by step time (the same tokens per step within a row's kind):"
grep -E "^small-(ddp2|zero|tp2|pp2)" "$RESULTS" | sort -t$'\t' -k4 -n | awk -F'\t' '{printf "  %-22s %s s\n", $1, $4}'
