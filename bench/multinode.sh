#!/usr/bin/env bash
# multinode.sh: loom across two hosts, on the two-host cluster of scripts/netns-cluster.sh (network
# namespaces joined by a bridge, each host's link rate limited with tc tbf), in one run:
#   1. all-reduce bus bandwidth at 1, 16 and 64 MiB (float32, 2 hosts x 2 ranks) for loom (hierarchical:
#      shared memory inside a host, MPI between hosts) and for OpenMPI's MPI_Allreduce (bench/comm_mpi.c)
#      on the same 4 ranks, their ratio, and loom's inter-host link utilization: an all-reduce over H
#      hosts must move 2(H-1)/H x size bytes each way across each host's link (size for 2 hosts: each
#      of the L ranks of a host exchanges its size/L slice), and tbf caps each direction at the rate,
#      so the bound is size x 8 / LOOM_NETNS_RATE and utilization = bound / time;
#   2. DDP training tokens/s at 2 hosts x 2 ranks against 1 host x 2 ranks (scaling efficiency =
#      tokens/s(2x2) / (2 x tokens/s(1x2))) with loom's communication and exposed-communication
#      fractions of the step, and PyTorch DDP (gloo) at 2 hosts x 2 ranks on the same cluster.
# Needs root (network namespaces), mpirun/mpicc, and for PyTorch /usr/bin/python3 with torch.
# Run it under the machine-wide benchmark lock: flock /tmp/loom-bench.lock bench/multinode.sh
#
#   env: LOOM_NETNS_RATE (2gbit), LOOM_NETNS_MTU (1500), ITERS (5), MODEL (small), B (4), T (128),
#        STEPS (6), WARMUP (2), TORCH=0 skips PyTorch, TRAIN=0 skips part 2
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export LOOM_NETNS_PREFIX=${LOOM_NETNS_PREFIX:-lmb$$}
RATE=${LOOM_NETNS_RATE:-2gbit}
export LOOM_NETNS_RATE=$RATE
MTU=${LOOM_NETNS_MTU:-1500}
export LOOM_NETNS_MTU=$MTU
NET=${LOOM_NETNS_NET:-10.231.7}
ITERS=${ITERS:-5}
MODEL=${MODEL:-small}
B=${B:-4}
T=${T:-128}
STEPS=${STEPS:-6}
WARMUP=${WARMUP:-2}
PY=/usr/bin/python3
C=scripts/netns-cluster.sh

why=$($C check) || { echo "multinode.sh: cannot build the cluster here: $why" >&2; exit 2; }
make -s build/loom
mkdir -p build/bench
mpicc -O2 -march=native -o build/bench/comm_mpi bench/comm_mpi.c
WORK=$(mktemp -d /tmp/loom-bench-mn.XXXXXX)
trap '$C down; rm -rf "$WORK"' EXIT
$C up

echo "multinode: 2 hosts x 2 ranks, link $RATE (tc tbf), MTU $MTU, $(nproc) CPUs shared by all ranks"
echo
# ---- 1. all-reduce ----
comm=(--op allreduce --min-bytes 1M --max-bytes 64M --iters "$ITERS" --warmup 1)
$C mpirun -np 4 "$ROOT/build/loom" bench comm "${comm[@]}" 2>/dev/null > "$WORK/loom.txt"
$C mpirun -np 4 "$ROOT/build/bench/comm_mpi" "${comm[@]}" 2>/dev/null > "$WORK/mpi.txt"
$PY - "$WORK/loom.txt" "$WORK/mpi.txt" "$RATE" <<'PYEOF'
import re, sys
def rows(p):
    out = {}
    for l in open(p):
        f = l.split()
        if len(f) >= 9 and f[0].isdigit():
            out[int(f[0])] = (float(f[6]), float(f[8]))  # time (us), busbw (GB/s)
    return out
loom, mpi = rows(sys.argv[1]), rows(sys.argv[2])
m = re.match(r"([\d.]+)([kmg]?)bit", sys.argv[3].lower())
rate = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
print("%10s %14s %14s %10s %10s %10s %10s" % ("size", "loom busbw", "MPI busbw", "loom/MPI", "loom time", "bound", "link util"))
for mib in (1, 16, 64):
    s = mib << 20
    if s not in loom or s not in mpi:
        continue
    (lt, lb), (mt, mb) = loom[s], mpi[s]
    bound = s * 8 / rate  # seconds: size bytes of payload each way at the rate
    print("%7d MiB %9.3f GB/s %9.3f GB/s %9.2fx %7.1f ms %7.1f ms %9.0f%%" % (mib, lb, mb, mt / lt, lt / 1e3,
          bound * 1e3, 100 * bound / (lt * 1e-6)))
print("(link util = the bound / loom's time: payload only; TCP/IP and Ethernet headers, ~4.5% at MTU 1500 and")
print(" ~0.7% at 9000 with the acknowledgements, also count against the tbf rate, so the wire is that much busier)")
PYEOF
echo

[ "${TRAIN:-1}" = 0 ] && exit 0
# ---- 2. DDP training ----
VOCAB=50257
[ "$MODEL" = tiny ] && VOCAB=257
$PY bench/random_shard.py "$WORK/train_000000.bin" "$B" "$T" "$STEPS" "$VOCAB" 4
stats() {
	$PY - "$1" "$WARMUP" <<'PYEOF'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "step" in r][int(sys.argv[2]):]  # step rows (not the config or summary record)
dt = sum(r["dt_ms"] for r in rows)
print("%.1f %.4f %.4f" % (sum(r["tokens_per_s"] * r["dt_ms"] for r in rows) / dt,
      sum(r.get("comm_ms", 0.0) for r in rows) / dt, sum(r.get("exposed_comm_ms", 0.0) for r in rows) / dt))
PYEOF
}
train=("$ROOT/build/loom" train --train-data "$WORK/train_*.bin" --model "$MODEL" --batch-size "$B" --seq-len "$T"
	--steps "$STEPS" --lr 6e-4 --threads 1 --peak-flops 1e11)
$C mpirun -np 2 --host "$NET.1:2" -x OMP_NUM_THREADS=1 "${train[@]}" --log "$WORK/l12.jsonl" >"$WORK/l12.out" 2>&1
$C mpirun -np 4 -x OMP_NUM_THREADS=1 "${train[@]}" --log "$WORK/l22.jsonl" >"$WORK/l22.out" 2>&1
read -r L12 C12 E12 <<<"$(stats "$WORK/l12.jsonl")"
read -r L22 C22 E22 <<<"$(stats "$WORK/l22.jsonl")"
P22=""
if [ "${TORCH:-1}" = 1 ] && $PY -c 'import torch' 2>/dev/null; then
	# torchrun's environment from mpirun's; gloo on the host's cluster interface.
	cat > "$WORK/torch_rank.sh" <<TORCHEOF
#!/bin/sh
export RANK=\$OMPI_COMM_WORLD_RANK WORLD_SIZE=\$OMPI_COMM_WORLD_SIZE LOCAL_RANK=\$OMPI_COMM_WORLD_LOCAL_RANK
export MASTER_ADDR=$NET.1 MASTER_PORT=29571 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export GLOO_SOCKET_IFNAME=\$(ip -o -4 addr show | awk '/ $NET\\./ {print \$2}')
exec $PY $ROOT/bench/torch_ddp.py --data $WORK/train_000000.bin --model $MODEL --batch-size $B --seq-len $T \
	--steps $STEPS --warmup $WARMUP --threads 1
TORCHEOF
	chmod +x "$WORK/torch_rank.sh"
	P22=$($C mpirun -np 4 "$WORK/torch_rank.sh" 2>"$WORK/torch.err" | sed -n 's/^tokens_per_s //p' | head -1) || true
	[ -n "$P22" ] || { echo "PyTorch DDP failed:"; tail -5 "$WORK/torch.err"; }
fi
$PY - "$L12" "$L22" "$C12" "$E12" "$C22" "$E22" "${P22:-0}" <<'PYEOF'
import sys
l12, l22, c12, e12, c22, e22, p22 = map(float, sys.argv[1:])
print("DDP, model and batch per rank as given; tokens/s of all ranks")
print("%-22s %12s %10s %12s" % ("", "tokens/s", "comm", "exposed comm"))
print("%-22s %12.1f %9.1f%% %11.1f%%" % ("loom 1 host x 2 ranks", l12, 100 * c12, 100 * e12))
print("%-22s %12.1f %9.1f%% %11.1f%%" % ("loom 2 hosts x 2 ranks", l22, 100 * c22, 100 * e22))
if p22 > 0:
    print("%-22s %12.1f" % ("PyTorch DDP 2 x 2", p22))
print()
print("scaling efficiency across hosts: %.3f (tokens/s 2x2 / (2 x 1x2))" % (l22 / (2 * l12)))
if p22 > 0:
    print("loom vs PyTorch DDP (gloo) at 2 x 2: %.2fx" % (l22 / p22))
PYEOF
