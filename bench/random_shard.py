# random_shard.py: the benchmarks' training data, an llm.c token shard (header magic 20240520,
# version 1, token count; then uint16 tokens) of random tokens, the same for every run (seed 0).
# Enough tokens for STEPS steps of RANKS ranks reading B x T windows, plus one (the last target).
#
#   /usr/bin/python3 bench/random_shard.py PATH B T STEPS VOCAB [RANKS (default 1)]
import sys

import numpy as np

path, B, T, steps, V = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
ranks = int(sys.argv[6]) if len(sys.argv) > 6 else 1
n = B * T * (ranks * steps + 1) + 1
hdr = np.zeros(256, np.int32)
hdr[:3] = (20240520, 1, n)
tok = np.random.default_rng(0).integers(0, V, n, dtype=np.uint16)
with open(path, "wb") as f:
    f.write(hdr.tobytes())
    f.write(tok.tobytes())
