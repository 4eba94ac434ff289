#!/usr/bin/env bash
# long_seq.sh: long sequences on one thread, the fused attention kernel's benchmark (issue 33).
# nanochat `--depth 6 --vocab-size 257` (C 384, 3 heads of 128, SSSL windows, short window T/2) at a
# fixed TOKENS per step (default 8192: B = TOKENS / T) for T = 256 ... 8192 (and 16384, one sequence),
# and GPT-2 `small` (L6 H6 C384) at T = 1024 and 4096. For each row: tokens/s (mean of the steps after
# WARMUP), the achieved FLOP rate counted as the kernel must do it (each query's keys inside the causal
# mask and its window: the count `loom plan` and MFU use, read from `loom plan --json` for the same
# flags), its fraction of the hardware's FMA peak (`loom bench gemm`), the MFU loom printed, and peak RSS
# (/usr/bin/time). A row whose printed MFU is above 100% or more than 10% away from achieved/peak is
# marked. With BF16=1 the nanochat T=4096 row runs again with --dtype bf16 (where the CPU has it). Last,
# nanochat on 2 ranks: cp 2 against dp 2 at T = 4096 and 8192 (CP_TS), the same tokens per step.
#
# usage: bench/long_seq.sh [STEPS (default 3)]
#   env: LOOM (build/loom), TOKENS (8192), WARMUP (1), TS ("256 1024 2048 4096 8192 16384"; "none" skips), GPT2_TS ("1024
#        4096"), CP_TS ("4096 8192"; "none" skips), REPEAT (1: runs per row, alternating, best kept), BF16 (0),
#        KEEP=1 keeps the work dir
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-3}
LOOM=${LOOM:-build/loom}
TOKENS=${TOKENS:-8192}
WARMUP=${WARMUP:-1}
REPEAT=${REPEAT:-1}
TS=${TS:-"256 1024 2048 4096 8192 16384"}
PY=/usr/bin/python3

[ -x "$LOOM" ] || { echo "build loom first (make): $LOOM not found" >&2; exit 1; }
WORK=$(mktemp -d /tmp/loom-bench-long.XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT
grep -o -m1 -w 'flags.*' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512[a-z_0-9]*|amx[a-z_0-9]*)$' |
	tr '\n' ' ' | sed 's/^/cpu flags: /; s/$/\n/'
PEAK=$("$LOOM" bench gemm --threads 1 | sed -n 's/^hardware peak.*--peak-flops \([0-9.e+]*\)).*/\1/p')
[ -n "$PEAK" ] || { echo "could not read the hardware peak from loom bench gemm" >&2; exit 1; }
printf 'long_seq: %d tokens per step, %d steps (first %d untimed), 1 thread, FMA peak %s FLOP/s\n' \
	"$TOKENS" "$STEPS" "$WARMUP" "$PEAK"
# enough random tokens for every row, in each family's vocabulary
mkdir -p "$WORK/nanochat" "$WORK/gpt2"
$PY bench/random_shard.py "$WORK/nanochat/train_000000.bin" 1 "$TOKENS" $((STEPS + 1)) 257 1
$PY bench/random_shard.py "$WORK/gpt2/train_000000.bin" 1 "$TOKENS" $((STEPS + 1)) 50257 1

ROWS=()
for t in $TS; do [ "$t" = none ] || ROWS+=("nanochat $t fp32"); done
for t in ${GPT2_TS-1024 4096}; do [ "$t" = none ] || ROWS+=("gpt2 $t fp32"); done
[ "${BF16:-0}" = 1 ] && ROWS+=("nanochat 4096 bf16")

model_flags() { # arch T
	if [ "$1" = gpt2 ]; then echo "--model small --n-positions $2"; else echo "--arch nanochat --depth 6 --vocab-size 257"; fi
}
run_row() { # arch T dtype -> "tok/s mfu fpt rss_mib"
	local arch=$1 t=$2 dt=$3 b log=$WORK/$1-$2-$3.jsonl flags fpt
	b=$((TOKENS / t)); [ "$b" -ge 1 ] || b=1
	flags="$(model_flags "$arch" "$t") --batch-size $b --seq-len $t"
	fpt=$("$LOOM" plan $flags --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["flops_per_token"])')
	rm -f "$log"
	OMP_NUM_THREADS=1 /usr/bin/time -f '%M' -o "$WORK/rss" "$LOOM" train --threads 1 --train-data "$WORK/$arch/train_*.bin" \
		$flags --steps "$STEPS" --warmup 0 --dtype "$dt" --peak-flops "$PEAK" --log "$log" >"$WORK/out" 2>&1 ||
		{ echo "  ($arch T=$t $dt failed: $(tail -n 1 "$WORK/out"))" >&2; echo "0 0 $fpt 0"; return; }
	$PY - "$log" "$WARMUP" "$fpt" "$(cat "$WORK/rss")" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"step"')][int(sys.argv[2]):]
tps = sum(r["tokens_per_s"] for r in rows) / len(rows)
mfu = sum(r["mfu"] for r in rows) / len(rows)
print("%.1f %.4f %s %.0f" % (tps, mfu, sys.argv[3], int(sys.argv[4]) / 1024))
EOF
}
declare -A TPS MFU FPT RSS
for rep in $(seq "$REPEAT"); do
	for row in "${ROWS[@]}"; do
		read -r tps mfu fpt rss < <(run_row $row)
		if [ -z "${TPS[$row]:-}" ] || awk "BEGIN{exit !($tps > ${TPS[$row]})}"; then
			TPS[$row]=$tps MFU[$row]=$mfu FPT[$row]=$fpt RSS[$row]=$rss
		fi
	done
done
printf '\n%-9s %6s %5s %3s %9s %14s %9s %9s %9s\n' model T dtype B "tok/s" "GFLOP/s (2)" "of peak" "MFU" "RSS MiB"
for row in "${ROWS[@]}"; do
	set -- $row
	b=$((TOKENS / $2)); [ "$b" -ge 1 ] || b=1
	rate=$(awk "BEGIN{print ${TPS[$row]} * ${FPT[$row]}}")
	frac=$(awk "BEGIN{print $rate / $PEAK}")
	mark=$(awk "BEGIN{m = ${MFU[$row]}; f = $frac; print (m > 1.0 || (f > 0 && (m / f > 1.1 || m / f < 0.9))) ? \"  <- MFU off\" : \"\"}")
	printf '%-9s %6s %5s %3s %9.1f %14.2f %8.1f%% %8.1f%% %9s%s\n' "$1" "$2" "$3" "$b" "${TPS[$row]}" \
		"$(awk "BEGIN{print $rate / 1e9}")" "$(awk "BEGIN{print 100 * $frac}")" \
		"$(awk "BEGIN{print 100 * ${MFU[$row]}}")" "${RSS[$row]}" "$mark"
done
k1="nanochat 1024 fp32" k4="nanochat 4096 fp32"
if [ -n "${RSS[$k1]:-}" ] && [ -n "${RSS[$k4]:-}" ]; then
	echo
	echo "peak RSS, T=4096 B=$((TOKENS / 4096)) over T=1024 B=$((TOKENS / 1024)): $(awk "BEGIN{printf \"%.3f\", ${RSS[$k4]} / ${RSS[$k1]}}")"
fi
# Context parallelism against data parallelism on 2 ranks x 1 thread at the same tokens per step (2 T):
# dp 2 trains one sequence per rank (B = 1), cp 2 two sequences split over both ranks (B = 2, each rank
# T/2 positions of each); the target is cp 2 >= 0.90 x dp 2's tokens/s.
echo
printf '%-9s %6s %-5s %9s %9s\n' model T mesh "tok/s" "RSS MiB"
CP_TS=${CP_TS:-4096 8192}
[ "$CP_TS" = none ] && CP_TS=
for t in $CP_TS; do
	for mesh in dp2 cp2; do
		log=$WORK/cp-$mesh-$t.jsonl
		if [ "$mesh" = dp2 ]; then flags="--batch-size 1"; else flags="--batch-size 2 --cp 2"; fi
		rm -f "$log"
		OMP_NUM_THREADS=1 /usr/bin/time -f '%M' -o "$WORK/rss" "$LOOM" train --nproc 2 --threads 1 \
			--train-data "$WORK/nanochat/train_*.bin" $(model_flags nanochat "$t") --seq-len "$t" $flags \
			--steps "$STEPS" --warmup 0 --peak-flops "$PEAK" --log "$log" >"$WORK/out" 2>&1 ||
			{ echo "  (nanochat T=$t $mesh failed: $(tail -n 1 "$WORK/out"))" >&2; continue; }
		tps=$($PY -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if l.startswith("{\"step\"")][int(sys.argv[2]):]; print("%.1f" % (sum(x["tokens_per_s"] for x in r)/len(r)))' "$log" "$WARMUP")
		printf '%-9s %6s %-5s %9s %9.0f\n' nanochat "$t" "$mesh" "$tps" "$(($(cat "$WORK/rss") / 1024))"
	done
done
