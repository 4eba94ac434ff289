#!/usr/bin/env bash
# ddp_scaling.sh: data-parallel scaling of `loom train` against PyTorch 1.13 DDP (gloo), in one run:
# tokens/s at 1 rank x 1 thread and at 2 ranks x 1 thread each, scaling efficiency
# = tokens/s(2) / (2 x tokens/s(1)), loom's 2-rank tokens/s against PyTorch DDP's, and loom's
# communication time and exposed (not hidden behind backward) communication time as fractions of
# the step time. Same config for both: the `small` preset (L6 H6 C384, vocab 50257), B=4, T=256,
# fp32, the same random-token shard, rank r reading window step*world + r.
#
# PyTorch runs at its best single-thread setting: OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=1 and
# jemalloc with decay disabled (LD_PRELOAD=libjemalloc.so.2, MALLOC_CONF=retain:true,...); its
# 1-rank figure is a plain process without the DDP wrapper, its 2-rank one DDP with bucket_cap_mb 25
# over gloo, started by torch.multiprocessing.spawn (bench/torch_ddp.py). loom's ranks are started by
# `loom run` (OMP_NUM_THREADS=1). tokens/s is the mean over the steps after the first WARMUP.
#
# usage: bench/ddp_scaling.sh [STEPS (default 12)]
#   env: LOOM (default build/loom), MODEL (small), B (4), T (256), WARMUP (2), KEEP=1 keeps the work dir
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-12}
LOOM=${LOOM:-build/loom}
MODEL=${MODEL:-small}
B=${B:-4}
T=${T:-256}
WARMUP=${WARMUP:-2}
VOCAB=50257
[ "$MODEL" = tiny ] && VOCAB=257
PY=/usr/bin/python3
JEMALLOC=libjemalloc.so.2
JEMALLOC_CONF=retain:true,dirty_decay_ms:-1,muzzy_decay_ms:-1

[ -x "$LOOM" ] || { echo "build loom first (make): $LOOM not found" >&2; exit 1; }
WORK=$(mktemp -d /tmp/loom-bench-ddp.XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT

# Random tokens over the model's vocabulary: enough windows for every step of 2 ranks without wrapping.
$PY bench/random_shard.py "$WORK/train_000000.bin" "$B" "$T" "$STEPS" "$VOCAB" 2

printf 'ddp_scaling: model %s, B=%d, T=%d per rank, %d steps (first %d untimed), fp32, 1 thread per rank\n' \
	"$MODEL" "$B" "$T" "$STEPS" "$WARMUP"

# Mean tokens/s (time-weighted), comm and exposed-comm fractions of loom's JSONL log after WARMUP steps.
loom_stats() {
	$PY - "$1" "$WARMUP" <<'PYEOF'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "step" in r][int(sys.argv[2]):]  # step rows (not the config or summary record)
dt = sum(r["dt_ms"] for r in rows)
tps = sum(r["tokens_per_s"] * r["dt_ms"] for r in rows) / dt
comm = sum(r.get("comm_ms", 0.0) for r in rows) / dt
exposed = sum(r.get("exposed_comm_ms", 0.0) for r in rows) / dt
print("%.1f %.4f %.4f %.1f" % (tps, comm, exposed, dt / len(rows)))
PYEOF
}

common=(train --train-data "$WORK/train_*.bin" --model "$MODEL" --batch-size "$B" --seq-len "$T" --steps "$STEPS"
	--lr 6e-4 --threads 1 --peak-flops 1e11)
OMP_NUM_THREADS=1 nice -n 5 "$LOOM" "${common[@]}" --log "$WORK/loom1.jsonl" >"$WORK/loom1.out"
read -r L1 _ _ L1MS <<<"$(loom_stats "$WORK/loom1.jsonl")"
OMP_NUM_THREADS=1 nice -n 5 "$LOOM" run --nproc-per-node 2 --ranks 0 "$LOOM" "${common[@]}" \
	--log "$WORK/loom2.jsonl" >"$WORK/loom2.out"
read -r L2 LCOMM LEXP L2MS <<<"$(loom_stats "$WORK/loom2.jsonl")"

tenv=(OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 LD_PRELOAD="$JEMALLOC" MALLOC_CONF="$JEMALLOC_CONF")
targs=(--data "$WORK/train_000000.bin" --model "$MODEL" --batch-size "$B" --seq-len "$T" --steps "$STEPS"
	--warmup "$WARMUP" --threads 1)
P1=$(env "${tenv[@]}" nice -n 5 $PY bench/torch_ddp.py "${targs[@]}" 2>"$WORK/torch1.err" | sed -n 's/^tokens_per_s //p')
P2=$(env "${tenv[@]}" nice -n 5 $PY bench/torch_ddp.py "${targs[@]}" --nproc 2 2>"$WORK/torch2.err" |
	sed -n 's/^tokens_per_s //p')
[ -n "$P1" ] && [ -n "$P2" ] || { echo "PyTorch failed:" >&2; tail -5 "$WORK"/torch*.err >&2; exit 1; }

echo
$PY - "$L1" "$L2" "$P1" "$P2" "$LCOMM" "$LEXP" "$L1MS" "$L2MS" <<'PYEOF'
import sys
l1, l2, p1, p2, comm, exp, l1ms, l2ms = map(float, sys.argv[1:])
print("%-8s %14s %14s %12s" % ("", "1 rank tok/s", "2 ranks tok/s", "efficiency"))
print("%-8s %14.1f %14.1f %12.3f" % ("loom", l1, l2, l2 / (2 * l1)))
print("%-8s %14.1f %14.1f %12.3f" % ("pytorch", p1, p2, p2 / (2 * p1)))
print()
print("loom 2 ranks vs PyTorch DDP 2 ranks: %.2fx" % (l2 / p2))
print("loom step: %.1f ms at 1 rank, %.1f ms at 2 ranks; all-reduce time %.1f%% of the step, "
      "exposed (not hidden behind backward) %.2f%%" % (l1ms, l2ms, 100 * comm, 100 * exp))
PYEOF
