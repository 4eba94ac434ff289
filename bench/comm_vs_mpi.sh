#!/bin/sh
# comm_vs_mpi.sh: `loom bench comm` (registered and ordinary buffers) against the same benchmark
# written over OpenMPI (bench/comm_mpi.c), in one run, with per-size ratios.
#
#   bench/comm_vs_mpi.sh [EXTRA ARGS for both, e.g. --iters 50]
#   environment: OP=allreduce NP=2 MIN=8 MAX=64M BIND=core (mpirun --bind-to: core is OpenMPI's
#   default at 2 ranks; none leaves placement to the kernel as loom run does) REPS=1
#
# Ratios: busbw loom/MPI (> 1 is better for loom) and time loom/MPI (< 1 is better for loom).
# Timing on a shared machine is noisy: with REPS=k the three benchmarks run k times, interleaved,
# and each size keeps its best (lowest) time, which estimates the quiet-machine figure for all three.
set -eu
cd "$(dirname "$0")/.."
OP=${OP:-allreduce}
NP=${NP:-2}
MIN=${MIN:-8}
MAX=${MAX:-64M}
BIND=${BIND:-core}
REPS=${REPS:-1}

command -v mpicc >/dev/null || { echo "comm_vs_mpi.sh: mpicc not found (apt-get install openmpi-bin libopenmpi-dev)" >&2; exit 2; }
make -s build/loom
mkdir -p build/bench
mpicc -O2 -march=native -o build/bench/comm_mpi bench/comm_mpi.c

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common="--op $OP --min-bytes $MIN --max-bytes $MAX"
rep=0
while [ "$rep" -lt "$REPS" ]; do
	rep=$((rep + 1))
	# shellcheck disable=SC2086
	build/loom run --nproc-per-node "$NP" --ranks 0 build/loom bench comm $common --registered 1 "$@" 2>/dev/null |
		sed 's/^\[rank 0\] //' >> "$out/reg"
	# shellcheck disable=SC2086
	build/loom run --nproc-per-node "$NP" --ranks 0 build/loom bench comm $common --registered 0 "$@" 2>/dev/null |
		sed 's/^\[rank 0\] //' >> "$out/unreg"
	# shellcheck disable=SC2086
	mpirun --allow-run-as-root --bind-to "$BIND" -np "$NP" build/bench/comm_mpi $common "$@" >> "$out/mpi"
done

for f in reg unreg mpi; do
	grep -q '^ *[0-9]' "$out/$f" || { echo "comm_vs_mpi.sh: the $f run printed no results:" >&2; cat "$out/$f" >&2; exit 1; }
done
echo "# $OP, $NP ranks, float32 sum; mpirun --bind-to $BIND; $(mpirun --version 2>/dev/null | head -1); best of $REPS"
grep -h 'memcpy baseline' "$out/reg" | sort -t: -k3 -g | tail -1
awk '
	FNR == 1 { file++ }
	/^#/ || NF < 10 { next }
	{ w[$1] += $10 }
	file == 1 && (!($1 in rt) || $7 < rt[$1]) { rt[$1] = $7; rb[$1] = $9; ra[$1] = $6 }
	file == 2 && (!($1 in ut) || $7 < ut[$1]) { ut[$1] = $7; ub[$1] = $9 }
	file == 3 && !($1 in mt) { order[++n] = $1 }
	file == 3 && (!($1 in mt) || $7 < mt[$1]) { mt[$1] = $7; mb[$1] = $9 }
	END {
		printf "%12s %6s | %9s %8s | %9s %8s | %9s %8s | %8s %8s %8s | %6s\n", "size(B)", "algo",
		       "reg us", "GB/s", "unreg us", "GB/s", "mpi us", "GB/s", "reg/mpi", "unreg/mpi", "t reg/mpi", "#wrong"
		for (i = 1; i <= n; i++) {
			s = order[i]
			if (!(s in rt) || !(s in ut)) continue
			printf "%12s %6s | %9.2f %8.3f | %9.2f %8.3f | %9.2f %8.3f | %8.2f %8.2f %8.2f | %6d\n", s, ra[s],
			       rt[s], rb[s], ut[s], ub[s], mt[s], mb[s],
			       (mb[s] > 0 ? rb[s] / mb[s] : 0), (mb[s] > 0 ? ub[s] / mb[s] : 0), (mt[s] > 0 ? rt[s] / mt[s] : 0), w[s]
		}
	}' "$out/reg" "$out/unreg" "$out/mpi"
