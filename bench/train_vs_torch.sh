#!/usr/bin/env bash
# train_vs_torch.sh: training throughput of `loom train` against PyTorch 1.13 on the same GPT-2,
# in one run: the `small` preset (L6 H6 C384, vocab 50257), B=4, T=256, the same random-token shard,
# at 1 and 2 threads, in fp32 and in bf16 (loom --dtype bf16 against PyTorch's CPU autocast to
# bfloat16); plus each one's MFU against the hardware's peak of its dtype that `loom bench gemm`
# measures (loom's FMA / bf16 dot-product loops), and what fraction of that peak each one achieves.
#
# PyTorch runs at its best on this machine, not its defaults: OPENBLAS_NUM_THREADS = OMP_NUM_THREADS
# = the thread count (torch.set_num_threads alone does not limit Debian's OpenBLAS), the OpenMP
# build of OpenBLAS for 2 threads, jemalloc with decay disabled (removes ~150k page faults per
# step), and the fastest OPENBLAS_CORETYPE for this CPU (its default, Haswell, and SkylakeX on
# AVX-512: each timed on the model's own matmul shapes first; a PyTorch user can set it too). loom
# runs with no environment variable set. tokens/s is the mean over the steps after the first WARMUP of each run; with REPEAT=R each
# side runs R times, alternating, and keeps its best (the machine may be shared: best-of is fair to
# both). The GEMM peaks are measured in the same run, per thread count.
#
# usage: bench/train_vs_torch.sh [STEPS (default 12)] [THREADS... (default "1 2")]
#   env: LOOM (default build/loom), MODEL (small), B (4), T (256), WARMUP (2), REPEAT (1),
#        DTYPES ("fp32 bf16"; bf16 runs on every CPU, natively on AVX512-BF16 / AMX), KEEP=1 keeps the work dir
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-12}
shift || true
THREADS=${*:-1 2}
LOOM=${LOOM:-build/loom}
MODEL=${MODEL:-small}
B=${B:-4}
T=${T:-256}
WARMUP=${WARMUP:-2}
REPEAT=${REPEAT:-1}
DTYPES=${DTYPES:-fp32 bf16}
PY=/usr/bin/python3
OMP_BLAS=/usr/lib/x86_64-linux-gnu/openblas-openmp
JEMALLOC=libjemalloc.so.2
JEMALLOC_CONF=retain:true,dirty_decay_ms:-1,muzzy_decay_ms:-1

[ -x "$LOOM" ] || { echo "build loom first (make): $LOOM not found" >&2; exit 1; }
WORK=$(mktemp -d /tmp/loom-bench-train.XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT

# Random tokens over the model's vocabulary: enough for every step of both runs without wrapping.
V=50257
[ "$MODEL" = tiny ] && V=257
$PY bench/random_shard.py "$WORK/train_000000.bin" "$B" "$T" "$STEPS" "$V"


printf 'train_vs_torch: model %s, B=%d, T=%d, %d steps (first %d untimed), %s\n' "$MODEL" "$B" "$T" "$STEPS" \
	"$WARMUP" "$DTYPES"
declare -A LOOM_TPS TORCH_TPS PEAK LOOM_MFU
FPT=0
best() { $PY -c 'import sys; print(max(float(x) for x in sys.argv[1:] if x))' "$@"; }
# PyTorch's fastest OpenBLAS core type here: each candidate times the model's matmul shapes
gemm=$("$LOOM" bench gemm --threads 1 --size 64)
echo "$gemm" | sed -n 's/^cpu: /cpu: /p; s/^fp32 GEMM: /loom: fp32 GEMM: /p'
grep -o -m1 -w 'flags.*' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512[a-z_0-9]*|amx[a-z_0-9]*)$' | tr '\n' ' ' |
	sed 's/^/cpu flags: /; s/$/\n/'
CORES="default Haswell"
echo "$gemm" | grep -q '^cpu: .*AVX-512' && CORES="$CORES SkylakeX"
TORCH_CORE="" best_core_gf=0
for c in $CORES; do
	cenv=(OMP_NUM_THREADS=1)
	[ "$c" != default ] && cenv+=(OPENBLAS_CORETYPE="$c")
	gf=$(env "${cenv[@]}" OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 $PY - <<'EOF3' 2>/dev/null || echo 0
import time, torch
torch.set_num_threads(1)
best = 0.0
for (m, n, k) in ((1024, 1536, 384), (1024, 384, 1536), (256, 50257, 384)):
    a, b = torch.randn(m, k), torch.randn(k, n)
    torch.mm(a, b)
    for _ in range(3):
        t = time.perf_counter(); torch.mm(a, b); dt = time.perf_counter() - t
        best = max(best, 2 * m * n * k / dt / 1e9)
print("%.1f" % best)
EOF3
)
	echo "torch sgemm with OPENBLAS_CORETYPE=$c: $gf GFLOP/s"
	if $PY -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$gf" "$best_core_gf"; then
		best_core_gf=$gf
		TORCH_CORE=$c
	fi
done
echo "PyTorch runs with OPENBLAS_CORETYPE=$TORCH_CORE"
[ "$TORCH_CORE" = default ] && TORCH_CORE=""

for t in $THREADS; do
	# the hardware peaks MFU is relative to, measured now, as `loom bench gemm` measures them
	gemm=$(nice -n 5 "$LOOM" bench gemm --threads "$t")
	PEAK[$t,fp32]=$(echo "$gemm" | sed -n 's/^hardware peak.*--peak-flops \([0-9.e+]*\)).*/\1/p')
	PEAK[$t,bf16]=$(echo "$gemm" | sed -n 's/^bf16 hardware peak.*--peak-flops \([0-9.e+]*\) .*/\1/p')
	echo "$gemm" | grep -E '^(hardware|bf16 hardware|sgemm|bf16 gemm) peak|^warning' | sed "s/^/  [$t thr] /"
	for d in $DTYPES; do
		LOOM_TPS[$t,$d]=0 TORCH_TPS[$t,$d]=0
		[ -n "${PEAK[$t,$d]}" ] || { echo "no $d hardware peak from loom bench gemm:" "$gemm" >&2; exit 1; }
	done
	for rep in $(seq "$REPEAT"); do
		for d in $DTYPES; do
			# loom: tokens/s from its JSONL log (steps after the warm-up); FLOP/token from its header
			out=$(nice -n 5 "$LOOM" train --train-data "$WORK/train_*.bin" --model "$MODEL" --batch-size "$B" \
				--seq-len "$T" --steps "$STEPS" --lr 6e-4 --threads "$t" \
				--dtype "$d" --log "$WORK/loom_$t.jsonl" --profile)
			[ "$rep" = 1 ] && { echo "$out" | grep -v '^step ' | sed 's/^/  [loom, '"$t"' thr, '"$d"'] /' || true; }
			read -r tps mfu <<<"$($PY - "$WORK/loom_$t.jsonl" "$WARMUP" <<'EOF2'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "step" in r][int(sys.argv[2]):]  # step rows (not the config or summary record)
w = sum(r["dt_ms"] for r in rows)
print("%.1f %.4f" % (sum(r["tokens_per_s"] * r["dt_ms"] for r in rows) / w, sum(r["mfu"] * r["dt_ms"] for r in rows) / w))
EOF2
)"
			if $PY -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$tps" "${LOOM_TPS[$t,$d]}"; then
				LOOM_MFU[$t,$d]=$mfu
			fi
			LOOM_TPS[$t,$d]=$(best "${LOOM_TPS[$t,$d]}" "$tps")
			FPT=$(echo "$out" | sed -n 's/.* \([0-9.e+]*\) FLOP per token.*/\1/p')

			# PyTorch at its best; bf16: torch.autocast("cpu", dtype=torch.bfloat16)
			env=(OMP_NUM_THREADS="$t" OPENBLAS_NUM_THREADS="$t" LD_PRELOAD="$JEMALLOC" MALLOC_CONF="$JEMALLOC_CONF")
			[ -n "$TORCH_CORE" ] && env+=(OPENBLAS_CORETYPE="$TORCH_CORE")
			[ "$t" -gt 1 ] && [ -d "$OMP_BLAS" ] && env+=(LD_LIBRARY_PATH="$OMP_BLAS")
			tout=$(env "${env[@]}" nice -n 5 $PY bench/torch_gpt2.py --data "$WORK/train_000000.bin" --model "$MODEL" \
				--batch-size "$B" --seq-len "$T" --steps "$STEPS" --warmup "$WARMUP" --threads "$t" --dtype "$d" \
				2>"$WORK/torch_$t.err")
			ttps=$(echo "$tout" | sed -n 's/^tokens_per_s //p')
			TORCH_TPS[$t,$d]=$(best "${TORCH_TPS[$t,$d]}" "$ttps")
			echo "  [$t thr, $d, run $rep] loom $tps tok/s, torch $ttps tok/s"
		done
	done
done

echo
printf '%-8s %-6s %14s %14s %8s %10s %10s %12s\n' threads dtype "loom tok/s" "torch tok/s" ratio "loom MFU" \
	"torch MFU" "loom prints"
for t in $THREADS; do
	for d in $DTYPES; do
		$PY - "$t" "$d" "${LOOM_TPS[$t,$d]}" "${TORCH_TPS[$t,$d]}" "${PEAK[$t,$d]}" "$FPT" "${LOOM_MFU[$t,$d]:-0}" <<'EOF'
import sys
t, d = sys.argv[1], sys.argv[2]
l, p, peak, fpt, printed = (float(x) for x in sys.argv[3:8])
print("%-8s %-6s %14.1f %14.1f %7.2fx %9.1f%% %9.1f%% %11.1f%%" % (t, d, l, p, l / p, 100 * l * fpt / peak,
      100 * p * fpt / peak, 100 * printed))
EOF
	done
done
if [[ " $DTYPES " == *" fp32 "* && " $DTYPES " == *" bf16 "* ]]; then
	for t in $THREADS; do
		$PY -c 'import sys; a = [float(x) for x in sys.argv[2:]]; print("%s thr: bf16 / fp32 tokens/s: loom %.2fx, torch %.2fx" % (sys.argv[1], a[0] / a[1], a[2] / a[3]))' \
			"$t" "${LOOM_TPS[$t,bf16]}" "${LOOM_TPS[$t,fp32]}" "${TORCH_TPS[$t,bf16]}" "${TORCH_TPS[$t,fp32]}"
	done
fi
printf '(MFU = achieved FLOP/s / the hardware peak of its dtype that `loom bench gemm` measures at that thread count: '
for t in $THREADS; do
	for d in $DTYPES; do printf '%s thr %s %.1f GFLOP/s; ' "$t" "$d" "$($PY -c "print(${PEAK[$t,$d]} / 1e9)")"; done
done
printf '%s FLOP per token)\n' "$FPT"
