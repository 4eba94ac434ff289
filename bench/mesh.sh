#!/usr/bin/env bash
# mesh.sh: choosing a mesh on 2 ranks x 1 thread, in one run: tokens/s of `loom train` for data
# parallel (dp2), tensor parallel (tp2) and one process with 2 threads, each with its communication
# fraction (comm and exposed comm, i.e. not hidden behind compute, as fractions of the step time),
# and the ratio of each to dp2. Same config for all: the `small` preset (L6 H6 C384, vocab 50257),
# fp32, a total batch of 8 x 256 tokens per step (dp2: B=4 per rank; tp2 and 1 process: B=8), the
# same random-token shard. tokens/s is the time-weighted mean over the steps after the first WARMUP.
# (Pipeline parallel rows are added by the pipeline work: see docs/mesh.md.)
#
# Run it alone (it times things): flock /tmp/loom-bench.lock bench/mesh.sh
# usage: bench/mesh.sh [STEPS (default 6)]
#   env: LOOM (default build/loom), MODEL (small), T (256), WARMUP (1), KEEP=1 keeps the work dir
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-6}
LOOM=${LOOM:-build/loom}
MODEL=${MODEL:-small}
T=${T:-256}
WARMUP=${WARMUP:-1}
TOTAL=8 # sequences per step
VOCAB=50257
[ "$MODEL" = tiny ] && VOCAB=257
PY=/usr/bin/python3

[ -x "$LOOM" ] || { echo "build loom first (make): $LOOM not found" >&2; exit 1; }
WORK=$(mktemp -d /tmp/loom-bench-mesh.XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT

$PY - "$WORK/train_000000.bin" "$TOTAL" "$T" "$STEPS" "$VOCAB" <<'PYEOF'
import sys, numpy as np
path, B, T, steps, V = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
n = B * T * (steps + 1) + 1
hdr = np.zeros(256, np.int32); hdr[:3] = (20240520, 1, n)
tok = np.random.default_rng(0).integers(0, V, n, dtype=np.uint16)
with open(path, "wb") as f:
    f.write(hdr.tobytes()); f.write(tok.tobytes())
PYEOF

printf 'mesh: model %s, %d x %d tokens per step, %d steps (first %d untimed), fp32, 2 ranks x 1 thread\n' \
	"$MODEL" "$TOTAL" "$T" "$STEPS" "$WARMUP"

# Mean tokens/s (time-weighted), comm and exposed-comm fractions, mean step ms of a JSONL log.
stats() {
	$PY - "$1" "$WARMUP" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][int(sys.argv[2]):]
dt = sum(r["dt_ms"] for r in rows)
tps = sum(r["tokens_per_s"] * r["dt_ms"] for r in rows) / dt
comm = sum(r.get("comm_ms", 0.0) for r in rows) / dt
exposed = sum(r.get("exposed_comm_ms", 0.0) for r in rows) / dt
print("%.1f %.4f %.4f %.1f" % (tps, comm, exposed, dt / len(rows)))
PYEOF
}

common=(train --train-data "$WORK/train_*.bin" --model "$MODEL" --seq-len "$T" --steps "$STEPS" --lr 6e-4
	--total-batch-size $((TOTAL * T)) --peak-flops 1e11)
run2() { # name, flags...: 2 ranks x 1 thread
	local name=$1; shift
	OMP_NUM_THREADS=1 nice -n 5 "$LOOM" run --nproc-per-node 2 --ranks 0 "$LOOM" "${common[@]}" --threads 1 "$@" \
		--log "$WORK/$name.jsonl" >"$WORK/$name.out" 2>&1 || { tail -5 "$WORK/$name.out" >&2; exit 1; }
}
run2 dp2 --batch-size $((TOTAL / 2))
run2 tp2 --batch-size "$TOTAL" --tp 2
OMP_NUM_THREADS=2 nice -n 5 "$LOOM" "${common[@]}" --batch-size "$TOTAL" --threads 2 --log "$WORK/one.jsonl" \
	>"$WORK/one.out" 2>&1 || { tail -5 "$WORK/one.out" >&2; exit 1; }

echo
printf '%-26s %10s %8s %8s %10s %8s\n' mesh tokens/s "vs dp2" comm exposed "step ms"
read -r D DC DE DMS <<<"$(stats "$WORK/dp2.jsonl")"
for name in dp2 tp2 one; do
	read -r S C E MS <<<"$(stats "$WORK/$name.jsonl")"
	case $name in
	dp2) label="dp2 (2 ranks x 1 thread)" ;;
	tp2) label="tp2 (2 ranks x 1 thread)" ;;
	one) label="1 process x 2 threads" ;;
	esac
	$PY -c "import sys; s,d,c,e,ms=map(float,sys.argv[2:]); print('%-26s %10.1f %7.3fx %7.1f%% %9.1f%% %8.0f' % (sys.argv[1], s, s/d, 100*c, 100*e, ms))" \
		"$label" "$S" "$D" "$C" "$E" "$MS"
done
