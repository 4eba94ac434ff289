#!/usr/bin/python3
"""torch_zero.py: PyTorch 1.13 ZeRO-1 (DistributedDataParallel + torch.distributed.optim.
ZeroRedundancyOptimizer, gloo) training throughput and peak memory of the same GPT-2 that `loom train`
trains, for bench/zero.sh. (PyTorch's FSDP fails at import with this Debian's torch 1.13 on Python
3.11, so ZeRO-1 is the stage PyTorch has here.)

ZeroRedundancyOptimizer shards AdamW's state over the ranks; DDP averages the gradients (all-reduce,
bucket_cap_mb 25); after its step each rank broadcasts the parameters it owns. parameters_as_bucket_view
(--bucket-view 1) keeps the parameters in per-rank flat buckets, which makes those broadcasts one per
rank; it is PyTorch's faster setting and the default here.

The model, data and optimizer are bench/torch_gpt2.py's (pre-LN GPT-2, tied lm head, AdamW with decay
on 2-D weights, clip_grad_norm_ 1.0, fp32). Run it alone for one process (no DDP wrapper: PyTorch's
best single process), or with --nproc N for N ranks with DDP (gloo backend, bucket_cap_mb 25 as
PyTorch's default), started by torch.multiprocessing.spawn (torch 1.13's `torch.distributed.run` fails
on this Debian's Python in its own error handling; ranks started by a torchrun-style launcher, with
RANK and WORLD_SIZE set, work too). Rank r reads window k = step*world + r of
the shard, as `loom train` does. Threads come from the caller's environment (OMP_NUM_THREADS,
OPENBLAS_NUM_THREADS) and --threads.

Rank 0 prints "tokens_per_s X": tokens of all ranks per second, over the steps after --warmup, each
step timed from a barrier so that every rank's work is inside it; every rank prints "peak_rss_bytes R X"
(its ru_maxrss)."""
import argparse
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt2 import GPT2, PRESETS  # noqa: E402


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", default="small")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2, help="untimed first steps")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bucket-mb", type=float, default=25)
    ap.add_argument("--nproc", type=int, default=2, help="ranks to spawn")
    ap.add_argument("--bucket-view", type=int, default=1, help="parameters_as_bucket_view")
    ap.add_argument("--port", type=int, default=29533, help="MASTER_PORT for the spawned ranks")
    return ap.parse_args()


def run(rank, world, a):
    torch.set_num_threads(a.threads)
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1337)  # the same initial weights on every rank (DDP also broadcasts them)
    L, H, C, T, V = PRESETS[a.model]
    B, Tt = a.batch_size, a.seq_len
    hdr = np.fromfile(a.data, dtype=np.int32, count=256)
    assert hdr[0] == 20240520, "not a token shard"
    tokens = np.fromfile(a.data, dtype=np.uint16, offset=1024).astype(np.int64)
    W = (tokens.size - 1) // (B * Tt)
    model = GPT2(L, H, C, T, V)
    # The causal mask is a bool buffer, which gloo cannot broadcast; it is the same on every rank anyway.
    model._ddp_params_and_buffers_to_ignore = ["mask"]
    net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb) if world > 1 else model
    decay = [p for p in model.parameters() if p.dim() == 2]
    nodecay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}]
    if world > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW,
                                      parameters_as_bucket_view=bool(a.bucket_view),
                                      lr=6e-4, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    else:
        opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    times = []
    for s in range(a.steps):
        k = (s * world + rank) % W
        win = torch.from_numpy(tokens[k * B * Tt: k * B * Tt + B * Tt + 1])
        x, y = win[:-1].view(B, Tt), win[1:].view(B, Tt)
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = net(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if world > 1:
            dist.barrier()
        dt = time.perf_counter() - t0
        times.append(dt)
        if rank == 0:
            print("torch step %d: loss %.4f, %.1f ms" % (s + 1, loss.item(), dt * 1e3), file=sys.stderr)
    timed = times[a.warmup:]
    if rank == 0:
        print("tokens_per_s %.1f" % (world * B * Tt * len(timed) / sum(timed)), flush=True)
    if world > 1:
        dist.barrier()
    print("peak_rss_bytes %d %d" % (rank, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024), flush=True)
    if world > 1:
        dist.destroy_process_group()


def main():
    a = parse()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), a)
    elif a.nproc > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(a.port)
        torch.multiprocessing.spawn(run, args=(a.nproc, a), nprocs=a.nproc, join=True)
    else:
        run(0, 1, a)


if __name__ == "__main__":
    main()
