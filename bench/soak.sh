#!/bin/sh
# soak.sh: a long run under random kills (issue 23): 2 ranks train the tiny preset under
# `loom run --max-restarts`, saving often, while a random rank gets `kill -9` every few minutes; at
# the end the run must equal an uninterrupted one bit for bit and leave nothing behind.
#
#   bench/soak.sh [MINUTES]    (default 10) how long the killed run should last; an uninterrupted
#                              reference of the same steps runs first (so about twice that in all)
#   bench/soak.sh --short      the script's own test (tests/test_soak.c): a few seconds, two kills,
#                              two restarts
#   environment: NP=2, KILL_MIN=60 KILL_MAX=240 (seconds between kills), SAVE_EVERY=10, KEEP=2
#   (--keep-checkpoints), SAMPLE_S=5 (RSS sampling), SEED=1, STEPS (instead of calibrating from
#   MINUTES), KEEP_DIR=1 keeps the work directory
#
# Reported, and checked (exit 1 when any fails):
#   identical   the last checkpoint's model and optimizer state equal the reference's, byte for byte
#   log         the JSONL log has every step 1..STEPS exactly once (a restart truncates it to the
#               step it resumes from)
#   stale       after the run: no /dev/shm/loom-<job>* segment, no process of the job, no .tmp-, .old-
#               or .pruned- directory in --save-dir and at most KEEP checkpoints
#   restarts    loom run restarted once per kill and exited 0
# RSS: each rank's VmRSS is sampled every SAMPLE_S seconds; the slope (KiB per minute, least squares
# over each attempt's samples after its first third, averaged over attempts) is reported per rank,
# with the peak. A slope near 0 means no growth after warm-up (checked only in long runs: > 1 MiB
# per minute fails). Not in CI; run it alone: flock /tmp/loom-bench.lock bench/soak.sh 60
set -eu
cd "$(dirname "$0")/.."
make -s build/loom
exec /usr/bin/python3 - "$@" <<'EOF'
import os, random, re, shutil, signal, subprocess, sys, tempfile, time

short = len(sys.argv) > 1 and sys.argv[1] == "--short"
MINUTES = 0.0 if short else float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
NP = int(os.environ.get("NP", "2"))
SAVE_EVERY = int(os.environ.get("SAVE_EVERY", "5" if short else "10"))
KEEP = int(os.environ.get("KEEP", "2"))
SAMPLE_S = float(os.environ.get("SAMPLE_S", "0.2" if short else "5"))
KILL_MIN = float(os.environ.get("KILL_MIN", "60"))
KILL_MAX = float(os.environ.get("KILL_MAX", "240"))
rng = random.Random(int(os.environ.get("SEED", "1")))
LOOM = os.path.abspath("build/loom")
work = tempfile.mkdtemp(prefix="loom-soak.")
job = f"soak{os.getpid()}"

def sh(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)

def die(msg):
    print("soak: FAILED: " + msg)
    sys.exit(1)

with open(os.path.join(work, "text.txt"), "w") as f:
    for name in sorted(os.listdir("docs")):
        if name.endswith(".md"):
            f.write(open(os.path.join("docs", name)).read())
r = sh([LOOM, "data", "prepare", "--input", os.path.join(work, "text.txt"), "--out",
        os.path.join(work, "data"), "--val-fraction", "0"])
if r.returncode:
    die("data prepare failed:\n" + r.stdout)

def train_cmd(ck, log, steps, restarts=None):
    cmd = [LOOM, "run", "--nproc-per-node", str(NP)]
    if restarts is not None:
        cmd += ["--max-restarts", str(restarts)]
    cmd += [LOOM, "train", "--train-data", os.path.join(work, "data", "train_*.bin"), "--steps", str(steps),
            "--seq-len", "32" if short else "64", "--batch-size", "2", "--threads", "1", "--peak-flops", "1e11",
            "--save-dir", ck, "--save-every", str(SAVE_EVERY), "--keep-checkpoints", str(KEEP), "--log", log,
            "--print-every", "1000000", "--resume"]
    if short:
        cmd += ["--n-layer", "1", "--n-embd", "32", "--n-head", "2"]
    return cmd

def env_for(j):
    e = dict(os.environ)
    e.update(OMP_NUM_THREADS="1", LOOM_JOB_ID=j)
    for k in ("LOOM_RUN_JOB_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        e.pop(k, None)
    return e

STEP_RE = re.compile(r'^\{"step":(\d+),')

def logged_steps(path):
    try:
        return [int(m.group(1)) for m in map(STEP_RE.match, open(path)) if m]
    except OSError:
        return []

def ranks_of(run_pid):
    """{rank: pid} of loom run's children (the current attempt's ranks)."""
    pids = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            stat = open(f"/proc/{p}/stat").read()
            rest = stat[stat.rindex(")") + 2:].split()
            if int(rest[1]) != run_pid or rest[0] in "ZX":
                continue
            env = open(f"/proc/{p}/environ", "rb").read().split(b"\0")
        except (OSError, ValueError):
            continue
        for kv in env:
            if kv.startswith(b"RANK="):
                pids[int(kv[5:])] = int(p)
    return pids

def rss_kib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None

def job_processes(j):
    found, tag = [], f"LOOM_JOB_ID={j}".encode()
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            stat = open(f"/proc/{p}/stat").read()
            if stat[stat.rindex(")") + 2] in "ZX":
                continue
            if tag in open(f"/proc/{p}/environ", "rb").read().split(b"\0"):
                found.append(int(p))
        except (OSError, ValueError):
            continue
    return found

# How many steps: STEPS, or calibrated so that the killed run lasts about MINUTES.
if "STEPS" in os.environ:
    STEPS = int(os.environ["STEPS"])
elif short:
    # the tiny preset runs a step in a few ms, faster than the poll below sees them: 40 steps were
    # over before the second kill could land (1 restart for 2 expected, now and then); 300 leave the
    # kills hundreds of steps of room and still take about a second
    STEPS = 300
else:
    cal = 30
    t0 = time.time()
    r = sh(train_cmd(os.path.join(work, "cal_ck"), os.path.join(work, "cal.jsonl"), cal), env=env_for(job + "c"))
    if r.returncode:
        die("calibration run failed:\n" + r.stdout[-3000:])
    STEPS = max(2 * SAVE_EVERY, int(MINUTES * 60 / ((time.time() - t0) / cal)))
kills = 2 if short else max(1, int(MINUTES * 60 / ((KILL_MIN + KILL_MAX) / 2)))

# The uninterrupted reference.
ref_ck = os.path.join(work, "ref_ck")
r = sh(train_cmd(ref_ck, os.path.join(work, "ref.jsonl"), STEPS), env=env_for(job + "r"))
if r.returncode:
    die("the reference run failed:\n" + r.stdout[-3000:])

print(f"# soak: {NP} ranks, {STEPS} steps, a checkpoint every {SAVE_EVERY} (keep {KEEP}), "
      f"{'2 kills (short)' if short else f'a kill every {KILL_MIN:g}-{KILL_MAX:g} s'}; work {work}")
ck, log, out_path = os.path.join(work, "ck"), os.path.join(work, "soak.jsonl"), os.path.join(work, "out.txt")
samples = {}  # (attempt, rank) -> [(t, kib)]
killed = []
t_start = time.time()
with open(out_path, "w") as out:
    run = subprocess.Popen(train_cmd(ck, log, STEPS, restarts=kills + 1 if short else 10**6),
                           env=env_for(job), stdout=out, stderr=subprocess.STDOUT)
    attempt, seen = 0, {}
    next_kill = None
    while run.poll() is None:
        now = time.time()
        pids = ranks_of(run.pid)
        if pids and set(pids.values()) != set(seen.values()):
            if seen:
                attempt += 1
            seen = dict(pids)
        for rank, pid in pids.items():
            k = rss_kib(pid)
            if k is not None:
                samples.setdefault((attempt, rank), []).append((now, k))
        steps = logged_steps(log)
        last = steps[-1] if steps else 0
        if len(killed) < kills and pids and next_kill is None:
            # the next kill: short mode after the next checkpoint; else after a random pause
            next_kill = (last // SAVE_EVERY + 1) * SAVE_EVERY + 2 if short else now + rng.uniform(KILL_MIN, KILL_MAX)
        strike = next_kill is not None and (last >= next_kill if short else now >= next_kill)
        if strike and pids and last < STEPS - SAVE_EVERY:
            victim = rng.choice(sorted(pids))
            try:
                os.kill(pids[victim], signal.SIGKILL)
                killed.append((round(now - t_start, 1), last, victim))
            except OSError:
                pass
            next_kill = None
            seen = dict(pids)  # the restart brings new pids
        time.sleep(SAMPLE_S if not short else 0.02)
    rc = run.wait()
elapsed = time.time() - t_start
text = open(out_path, errors="replace").read()
restarts = len(re.findall(r"restarting all \d+ ranks", text))

fail = []
if rc != 0:
    fail.append(f"loom run exited {rc}")
if restarts != len(killed):
    fail.append(f"{restarts} restarts for {len(killed)} kills")
last = f"step_{STEPS:08d}"
for part in ("model.safetensors", "optim.safetensors"):
    a, b = os.path.join(ref_ck, last, part), os.path.join(ck, last, part)
    if not (os.path.exists(a) and os.path.exists(b)) or open(a, "rb").read() != open(b, "rb").read():
        fail.append(f"{last}/{part} differs from the uninterrupted run's (or is missing)")
steps = logged_steps(log)
if steps != list(range(1, STEPS + 1)):
    dup = sorted({s for s in steps if steps.count(s) > 1})[:5]
    miss = sorted(set(range(1, STEPS + 1)) - set(steps))[:5]
    fail.append(f"log: {len(steps)} step lines for {STEPS} steps (repeated {dup}, missing {miss})")
time.sleep(0.2)
segs = [n for n in os.listdir("/dev/shm") if n.startswith(f"loom-{job}")]
procs = job_processes(job)
entries = sorted(os.listdir(ck)) if os.path.isdir(ck) else []
stale = [e for e in entries if e.startswith(".")]
ckpts = [e for e in entries if e.startswith("step_")]
if segs or procs or stale or len(ckpts) > KEEP:
    fail.append(f"stale: /dev/shm {segs}, processes {procs}, save dir {stale}, {len(ckpts)} checkpoints (keep {KEEP})")

def slope(pts):
    """least-squares KiB per minute."""
    n = len(pts)
    if n < 3:
        return None
    mt = sum(t for t, _ in pts) / n
    mk = sum(k for _, k in pts) / n
    var = sum((t - mt) ** 2 for t, _ in pts)
    return None if var == 0 else 60 * sum((t - mt) * (k - mk) for t, k in pts) / var

print(f"kills (s, step, rank): {killed}; restarts {restarts}; {elapsed:.0f} s")
for rank in range(NP):
    sl, peak = [], 0
    for (a, rk), pts in sorted(samples.items()):
        if rk != rank:
            continue
        peak = max([peak] + [k for _, k in pts])
        s = slope(pts[len(pts) // 3:])
        if s is not None:
            sl.append(s)
    avg = sum(sl) / len(sl) if sl else float("nan")
    print(f"rank {rank}: RSS peak {peak / 1024:.1f} MiB, slope after warm-up {avg:+.1f} KiB/min "
          f"(over {len(sl)} attempts)")
    if not short and sl and avg > 1024:
        fail.append(f"rank {rank}: RSS grows {avg:.0f} KiB/min after warm-up")
print(f"identical: {'no' if any('differs' in f for f in fail) else 'yes'}; log: "
      f"{'every step once' if steps == list(range(1, STEPS + 1)) else 'BAD'}; stale: "
      f"{'none' if not any(f.startswith('stale') for f in fail) else 'YES'}")
if fail:
    for f in fail:
        print("soak: FAILED: " + f)
    print(open(out_path, errors="replace").read()[-3000:])
    sys.exit(1)
if os.environ.get("KEEP_DIR") != "1":
    shutil.rmtree(work, ignore_errors=True)
print("soak: ok")
EOF
