#!/usr/bin/env bash
# act_ckpt.sh: what activation checkpointing costs and saves: `loom train` on the `small` preset
# (L6 H6 C384, vocab 50257), B=4, T=256, fp32, one thread, with --activation-checkpointing none,
# blocks and selective, in one run on the same random-token shard. tokens/s is the mean over the
# steps after the first WARMUP of a run; with REPEAT=R the modes run R times, alternating, and each
# keeps its best and reports the spread (the machine may be shared). Activation bytes come from the
# JSONL config record (the model's layout: kept + recompute scratch), the peak RSS from the last step.
# BASE=path/to/loom adds a row for another build without the flag (e.g. the "before" build), so that
# `none` can be checked against it.
#
# usage: bench/act_ckpt.sh [STEPS (default 10)]
#   env: LOOM (build/loom), BASE (unset), MODEL (small), B (4), T (256), THREADS (1), WARMUP (2),
#        REPEAT (3), KEEP=1 keeps the work dir
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-10}
LOOM=${LOOM:-build/loom}
BASE=${BASE:-}
MODEL=${MODEL:-small}
B=${B:-4}
T=${T:-256}
THREADS=${THREADS:-1}
WARMUP=${WARMUP:-2}
REPEAT=${REPEAT:-3}
PY=/usr/bin/python3

[ -x "$LOOM" ] || { echo "build loom first (make): $LOOM not found" >&2; exit 1; }
WORK=$(mktemp -d /tmp/loom-bench-ackpt.XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT

V=50257
[ "$MODEL" = tiny ] && V=257
$PY bench/random_shard.py "$WORK/train_000000.bin" "$B" "$T" "$STEPS" "$V"

printf 'act_ckpt: model %s, B=%d, T=%d, %d thread(s), %d steps (first %d untimed), %d repeats\n' "$MODEL" "$B" "$T" \
	"$THREADS" "$STEPS" "$WARMUP" "$REPEAT"
ROWS="none blocks selective"
[ -n "$BASE" ] && ROWS="base $ROWS"
for rep in $(seq "$REPEAT"); do
	for mode in $ROWS; do
		bin=$LOOM flag=(--activation-checkpointing "$mode")
		[ "$mode" = base ] && bin=$BASE flag=()
		nice -n 5 "$bin" train --train-data "$WORK/train_*.bin" --model "$MODEL" --batch-size "$B" --seq-len "$T" \
			--steps "$STEPS" --lr 6e-4 --threads "$THREADS" --peak-flops 1e11 "${flag[@]}" \
			--log "$WORK/${mode}_$rep.jsonl" >"$WORK/${mode}_$rep.out"
		[ "$rep" = 1 ] && grep '^activations per rank' "$WORK/${mode}_$rep.out" | sed "s/^/  [$mode] /" || true
	done
done

$PY - "$WORK" "$WARMUP" "$REPEAT" $ROWS <<'EOF'
import json, sys
work, warm, rep, modes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
res = {}
for m in modes:
    tps, cfg, rss, losses = [], None, 0, None
    for r in range(1, rep + 1):
        rows = [json.loads(l) for l in open("%s/%s_%d.jsonl" % (work, m, r))]
        cfg = next((x["config"] for x in rows if "config" in x), cfg)
        steps = [x for x in rows if "step" in x]
        t = steps[warm:]
        tps.append(sum(x["tokens_per_s"] * x["dt_ms"] for x in t) / sum(x["dt_ms"] for x in t))
        rss = max(rss, steps[-1].get("peak_rss_bytes", 0))
        losses = [x["loss"] for x in steps]
    res[m] = (max(tps), min(tps), cfg.get("activation_bytes"), rss, losses)
ref = res["none"][0]
print("\n%-10s %10s %16s %9s %14s %14s %12s" % ("mode", "tok/s", "spread (min)", "cost", "activations", "+ scratch", "peak RSS"))
for m in modes:
    best, worst, ab, rss, _ = res[m]
    act = "%.1f MiB" % ((ab["kept"] + ab["recompute"]) / 2**20) if ab else "-"
    scr = "%.1f MiB" % ((ab["head"] + ab["backward"]) / 2**20) if ab else "-"
    print("%-10s %10.1f %16.1f %8.1f%% %14s %14s %8.0f MiB" % (m, best, worst, 100 * (1 - best / ref), act, scr, rss / 2**20))
same = all(res[m][4] == res["none"][4] for m in modes if m != "base")
print("per-step losses of every mode identical to none's: %s" % ("yes" if same else "NO"))
EOF
