#!/usr/bin/env bash
# arch.sh: the model families and optimizers side by side, in one run: nanochat's GPT at --depth 6
# (C 384, 3 heads of 128, 6 layers, ReLU^2 MLP, untied head, vocabulary 50257 padded to 50304)
# against GPT-2 `small` (L6 H6 C384, the same width and vocabulary) at T 256, on 1 rank x 1 thread and
# on 2 ranks x 1 thread; for each, AdamW and MuonAdamW (DistMuon at 2 ranks). Reports tokens/s, MFU
# (against the hardware's fp32 peak, the same for every row) and the optimizer step's share of the
# step (optim_ms / dt_ms from the JSONL log).
#
# The Muon step's cost is per step, not per token (Polar Express: about 100 GFLOP for these matrices),
# so its share falls as the step's tokens grow: the runs use ACCUM micro-batches of B x T per rank and
# step (default 8: 8192 tokens at 1 rank), as nanochat's --total-batch-size (2^19 tokens) does at scale.
#
# usage: bench/arch.sh [STEPS (default 4)]
#   env: LOOM (build/loom), B (4), T (256), ACCUM (8), WARMUP (1: steps not timed), REPEAT (1: runs per
#        row, alternating rows, best kept), KEEP=1 keeps the work dir
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-4}
LOOM=${LOOM:-build/loom}
B=${B:-4}
T=${T:-256}
ACCUM=${ACCUM:-8}
WARMUP=${WARMUP:-1}
REPEAT=${REPEAT:-1}
PY=/usr/bin/python3
V=50257

[ -x "$LOOM" ] || { echo "build loom first (make): $LOOM not found" >&2; exit 1; }
WORK=$(mktemp -d /tmp/loom-bench-arch.XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT
$PY bench/random_shard.py "$WORK/train_000000.bin" "$B" "$T" $((STEPS * ACCUM)) "$V" 2

grep -o -m1 -w 'flags.*' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512[a-z_0-9]*|amx[a-z_0-9]*)$' |
	tr '\n' ' ' | sed 's/^/cpu flags: /; s/$/\n/'
# one peak for every row: the hardware's fp32 FMA peak on 1 thread, as loom measures it
PEAK=$("$LOOM" bench gemm --threads 1 | sed -n 's/^hardware peak.*--peak-flops \([0-9.e+]*\)).*/\1/p')
[ -n "$PEAK" ] || { echo "could not read the hardware peak from loom bench gemm" >&2; exit 1; }
printf 'arch: B=%d T=%d accum=%d per rank, %d steps (first %d untimed), 1 thread per rank, peak %s FLOP/s\n' \
	"$B" "$T" "$ACCUM" "$STEPS" "$WARMUP" "$PEAK"

# rows: model optimizer ranks zero-stage (DistMuon at 2 ranks: over DDP's all-reduce, zero 0, or as
# nanochat's DistMuonAdamW communicates, reduce-scatter to the owners and all-gather, zero 2)
ROWS=("gpt2 adamw 1 0" "nanochat adamw 1 0" "nanochat muon 1 0" "gpt2 muon 1 0" "gpt2 adamw 2 0" "nanochat adamw 2 0"
	"nanochat muon 2 0" "nanochat muon 2 2" "gpt2 muon 2 0")
run_row() { # arch optimizer ranks zero -> "tok/s mfu optim_share optim_ms"
	local arch=$1 opt=$2 n=$3 zero=$4 model log=$WORK/$1-$2-$3-$4.jsonl
	if [ "$arch" = gpt2 ]; then model="--model small"; else model="--arch nanochat --depth 6 --vocab-size $V"; fi
	rm -f "$log"
	OMP_NUM_THREADS=1 "$LOOM" train --nproc "$n" --zero "$zero" --threads 1 --train-data "$WORK/train_*.bin" $model \
		--batch-size "$B" --seq-len "$T" --grad-accum "$ACCUM" --steps "$STEPS" --warmup 0 --optimizer "$opt" \
		--peak-flops "$PEAK" --log "$log" >"$WORK/out" 2>&1 || { cat "$WORK/out" >&2; exit 1; }
	$PY - "$log" "$WARMUP" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"step"')]
rows = rows[int(sys.argv[2]):]
dt = sum(r["dt_ms"] for r in rows); opt = sum(r["optim_ms"] for r in rows)
tps = sum(r["tokens_per_s"] for r in rows) / len(rows); mfu = sum(r["mfu"] for r in rows) / len(rows)
print("%.1f %.4f %.4f %.1f" % (tps, mfu, opt / dt, opt / len(rows)))
EOF
}
declare -A TPS MFU OPT OMS
for rep in $(seq "$REPEAT"); do
	for row in "${ROWS[@]}"; do
		read -r tps mfu opt oms < <(run_row $row)
		if [ -z "${TPS[$row]:-}" ] || awk "BEGIN{exit !($tps > ${TPS[$row]})}"; then
			TPS[$row]=$tps MFU[$row]=$mfu OPT[$row]=$opt OMS[$row]=$oms
		fi
	done
done
printf '\n%-9s %-6s %5s %4s %10s %7s %12s %10s\n' model optim ranks zero "tok/s" MFU "optim share" "optim ms"
for row in "${ROWS[@]}"; do
	set -- $row
	printf '%-9s %-6s %5s %4s %10.1f %6.1f%% %11.1f%% %10.1f\n' "$1" "$2" "$3" "$4" "${TPS[$row]}" \
		"$(awk "BEGIN{print 100*${MFU[$row]}}")" "$(awk "BEGIN{print 100*${OPT[$row]}}")" "${OMS[$row]}"
done
ratio() { awk "BEGIN{printf \"%.3f\", $1 / $2}"; }
echo
for n in 1 2; do
	echo "ranks $n: nanochat MFU / GPT-2 MFU (AdamW) = $(ratio "${MFU["nanochat adamw $n 0"]}" "${MFU["gpt2 adamw $n 0"]}")"
done
echo "Muon step share at 1 rank: $(awk "BEGIN{printf \"%.1f%%\", 100*${OPT["nanochat muon 1 0"]}}") (target <= 10%)"
echo "DistMuon step at 2 ranks / Muon step at 1 rank: over DDP $(ratio "${OMS["nanochat muon 2 0"]}" "${OMS["nanochat muon 1 0"]}"), with ZeRO-2 $(ratio "${OMS["nanochat muon 2 2"]}" "${OMS["nanochat muon 1 0"]}") (ms; target <= 0.6)"
