#!/usr/bin/env bash
# zero.sh: `loom train --zero 0|1|2|3` at 2 ranks x 1 thread against PyTorch 1.13's ZeRO-1 (DDP +
# ZeroRedundancyOptimizer, gloo), in one run: tokens/s and peak RSS (rank 0) of loom's DDP and ZeRO
# stages 1-3 and PyTorch's ZeRO-1 (both ranks), on the `small` and `gpt2` (124M) presets; loom's
# stages against loom's DDP (targets: stages 1, 2 >= 0.97x, stage 3 >= 0.90x), loom ZeRO-1 against
# PyTorch's (target >= 1.15x), and each stage's model-state bytes per rank against its formula
# (P parameters, N = 2: DDP 16P, ZeRO-1 8P + 8P/N, ZeRO-2 4P + 12P/N, ZeRO-3 16P/N).
#
# Same config for both: fp32, the same random-token shard, rank r reading window step*world + r;
# small: B=4, T=256; gpt2: B=1, T=256 (a step of 124M parameters on one thread takes seconds).
# PyTorch runs at its best settings of bench/ddp_scaling.sh (one thread, jemalloc without decay,
# DDP bucket_cap_mb 25) with parameters_as_bucket_view. tokens/s is the mean after the first WARMUP
# steps of a run; the configurations run in turn ROUNDS times (DDP, Z1, Z2, Z3, PyTorch, DDP, ...)
# and each keeps its best run, so that a slowdown from other work on the machine hits every one
# alike. Run it under the machine's benchmark lock: flock /tmp/loom-bench.lock bench/zero.sh
#
# usage: bench/zero.sh [STEPS (default 8)]
#   env: LOOM (build/loom), MODELS ("small gpt2"), WARMUP (2), GPT2_STEPS (5), ROUNDS (2),
#        KEEP=1 keeps the work dir
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-8}
LOOM=${LOOM:-build/loom}
MODELS=${MODELS:-small gpt2}
WARMUP=${WARMUP:-2}
GPT2_STEPS=${GPT2_STEPS:-5}
ROUNDS=${ROUNDS:-2}
PY=/usr/bin/python3
JEMALLOC=libjemalloc.so.2
JEMALLOC_CONF=retain:true,dirty_decay_ms:-1,muzzy_decay_ms:-1

[ -x "$LOOM" ] || { echo "build loom first (make): $LOOM not found" >&2; exit 1; }
WORK=$(mktemp -d /tmp/loom-bench-zero.XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT

# Mean tokens/s (time-weighted) after WARMUP, the peak RSS and the model-state bytes of a JSONL log.
loom_stats() {
	$PY - "$1" "$WARMUP" <<'PYEOF'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "step" in r]  # step rows (not the config or summary record)
t = rows[int(sys.argv[2]):]
dt = sum(r["dt_ms"] for r in t)
print("%.1f %d %d" % (sum(r["tokens_per_s"] * r["dt_ms"] for r in t) / dt, max(r["peak_rss_bytes"] for r in rows),
                      rows[-1]["mem_model_states_bytes"]))
PYEOF
}

RESULTS="$WORK/results"
: >"$RESULTS"
for MODEL in $MODELS; do
	B=4 T=256 N=$STEPS V=50257
	[ "$MODEL" = gpt2 ] && B=1 N=$GPT2_STEPS
	[ "$MODEL" = tiny ] && T=128 V=257
	DATA="$WORK/$MODEL"
	mkdir -p "$DATA"
	$PY bench/random_shard.py "$DATA/train_000000.bin" "$B" "$T" "$N" "$V" 2
	printf 'zero: model %s, B=%d, T=%d per rank, %d steps (first %d untimed), fp32, 2 ranks x 1 thread\n' \
		"$MODEL" "$B" "$T" "$N" "$WARMUP"
	P=
	for R in $(seq "$ROUNDS"); do
		for Z in 0 1 2 3; do
			OMP_NUM_THREADS=1 nice -n 5 "$LOOM" run --nproc-per-node 2 --ranks 0 "$LOOM" train \
				--train-data "$DATA/train_*.bin" --model "$MODEL" --batch-size "$B" --seq-len "$T" --steps "$N" \
				--lr 6e-4 --threads 1 --peak-flops 1e11 --zero "$Z" --log "$WORK/$MODEL.z$Z.jsonl" \
				>"$WORK/$MODEL.z$Z.out"
			P=$(sed -n 's/.*with P = \([0-9]*\),.*/\1/p' "$WORK/$MODEL.z$Z.out" | head -1)
			echo "$MODEL loom$Z $P $(loom_stats "$WORK/$MODEL.z$Z.jsonl")" >>"$RESULTS"
		done
		env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 LD_PRELOAD="$JEMALLOC" MALLOC_CONF="$JEMALLOC_CONF" nice -n 5 \
			$PY bench/torch_zero.py --data "$DATA/train_000000.bin" --model "$MODEL" --batch-size "$B" --seq-len "$T" \
			--steps "$N" --warmup "$WARMUP" --threads 1 --nproc 2 >"$WORK/$MODEL.torch.out" 2>"$WORK/$MODEL.torch.err" ||
			{ echo "PyTorch failed:" >&2; tail -5 "$WORK/$MODEL.torch.err" >&2; exit 1; }
		TPS=$(sed -n 's/^tokens_per_s //p' "$WORK/$MODEL.torch.out")
		RSS=$(sed -n 's/^peak_rss_bytes [0-9]* //p' "$WORK/$MODEL.torch.out" | sort -n | tail -1)
		echo "$MODEL torch1 $P $TPS $RSS 0" >>"$RESULTS"
	done
done

echo
$PY - "$RESULTS" <<'PYEOF'
import sys
rows = [l.split() for l in open(sys.argv[1])]
formula = {"loom0": (16, 0, "16P"), "loom1": (8, 8, "8P+8P/N"), "loom2": (4, 12, "4P+12P/N"), "loom3": (0, 16, "16P/N")}
names = {"loom0": "loom DDP", "loom1": "loom ZeRO-1", "loom2": "loom ZeRO-2", "loom3": "loom ZeRO-3",
         "torch1": "PyTorch ZeRO-1"}
for model in dict.fromkeys(r[0] for r in rows):
    rs = {}
    for r in rows:  # each configuration's best run
        if r[0] == model and (r[1] not in rs or float(r[3]) > float(rs[r[1]][3])):
            rs[r[1]] = r
    runs = sum(1 for r in rows if r[0] == model and r[1] == "loom0")
    ddp = float(rs["loom0"][3])
    print("%s (P = %s, N = 2; best of %d runs each)" % (model, rs["loom0"][2], runs))
    print("  %-15s %10s %8s %13s %16s %18s" % ("", "tokens/s", "vs DDP", "peak RSS MiB", "model states MiB",
                                                "formula MiB"))
    for k in ("loom0", "loom1", "loom2", "loom3", "torch1"):
        if k not in rs:
            continue
        _, _, P, tps, rss, states = rs[k]
        P, tps = int(P), float(tps)
        f = ""
        if k in formula:
            a, b, txt = formula[k]
            f = "%9.1f %s" % ((a * P + b * P / 2) / 1048576, txt)
        print("  %-15s %10.1f %7.3fx %13.1f %16s %18s" % (names[k], tps, tps / ddp, int(rss) / 1048576,
              "%.1f" % (int(states) / 1048576) if k != "torch1" else "-", f))
    print("  loom ZeRO-1 vs PyTorch ZeRO-1: %.2fx" % (float(rs["loom1"][3]) / float(rs["torch1"][3])))
    print()
PYEOF
