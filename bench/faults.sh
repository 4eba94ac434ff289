#!/bin/sh
# faults.sh: a fault campaign against `loom run` + `loom train` (issue 13): N random trials, each
# one training job hit by one fault, then resumed from its last checkpoint.
#
#   bench/faults.sh [N]        (default 10)
#   environment: NP=2 ranks, STEPS=200 optimizer steps, SAVE_EVERY=20, SEED=1 (the campaign's
#   random choices), FAULTS=kill9,sigstop,killsave (the faults drawn from), KEEP=1 keeps the work
#   directory
#
# Faults: kill9 (SIGKILL to a random rank at a random step), sigstop (SIGSTOP to a random rank),
# killsave (SIGKILL to a random rank while a checkpoint is being written: the moment a .tmp-step_
# directory appears in --save-dir). The data is a tiny byte-level token set made here with
# `loom data prepare` from docs/*.md; the model is the tiny preset at sequence length 64.
#
# One table row per trial:
#   detected   loom run's "first failure" names the rank that was hit (yes/no)
#   exit_s     seconds from the fault to loom run's exit (a hang: > 60 s, the job is then killed)
#   leftovers  /dev/shm/loom-<job>@* segments plus processes of the job still alive after loom run
#              exited
#   resumed    `--resume` from the last complete checkpoint ran to the end and every step's loss
#              in its log equals, as written (bit for bit), the loss of that step in an
#              uninterrupted reference run
# The last line sums it up; the target is every trial detected within 2 s, no hang, no leftover,
# every resume identical. Run it alone: flock /tmp/loom-bench.lock bench/faults.sh 30
#
#   bench/faults.sh --cross-host [N]   (N trials of each kind, default 20; root: network namespaces)
#   environment: FAULTS=link1,link30,hoststop,kill9pp,kill9zero3,killsave, STEPS=40, SAVE_EVERY=5,
#   LOOM_TIMEOUT_S=10, SEED=1, KEEP=1
#
# Cross-host faults (issue 23) on the two-host cluster of scripts/netns-cluster.sh (2 x 2 ranks under
# mpirun, its own namespaces), training with --save-every, --keep-checkpoints 2 and --resume: link1
# and link30 (the link between the hosts down for 1 s and 30 s), hoststop (every process of host 1
# SIGSTOPped for 2 x LOOM_TIMEOUT_S), kill9pp (kill -9 of a host-1 rank under --pp 2: pipeline
# sends), kill9zero3 (under --zero 3: gathers), killsave (--zero 3, while a sharded checkpoint is
# written). One row per trial, then per kind: detected (a rank names host 1, or mpirun names the rank
# killed on host 1's address; a short outage may ride through instead: the job ends normally), the
# maximum time from the fault to the first such message, hangs (mpirun still running 120 s after the
# fault), checkpoints lost or damaged (the resumed run starts before the last checkpoint committed
# before the fault, or cannot resume), and resumes whose final checkpoint is byte-identical to an
# uninterrupted run's. Run it alone: flock /tmp/loom-bench.lock bench/faults.sh --cross-host 20
set -eu
cd "$(dirname "$0")/.."
make -s build/loom
if [ "${1:-}" = --cross-host ]; then
	shift
	exec /usr/bin/python3 - "$@" <<'EOF'
import os, random, re, shutil, signal, subprocess, sys, tempfile, threading, time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20
KINDS = os.environ.get("FAULTS", "link1,link30,hoststop,kill9pp,kill9zero3,killsave").split(",")
STEPS = int(os.environ.get("STEPS", "40"))
SAVE_EVERY = int(os.environ.get("SAVE_EVERY", "5"))
TIMEOUT_S = int(os.environ.get("LOOM_TIMEOUT_S", "10"))
rng = random.Random(int(os.environ.get("SEED", "1")))
LOOM = os.path.abspath("build/loom")
CL = os.path.abspath("scripts/netns-cluster.sh")
P = f"lf{os.getpid() % 100000}"
HOST1_ADDR = os.environ.get("LOOM_NETNS_NET", "10.231.7") + ".2"
os.environ["LOOM_NETNS_PREFIX"] = P
work = tempfile.mkdtemp(prefix="loom-xfaults.")
# What each kind does to host 1 (the second namespace), the training it hits, and how long it lasts.
SETUP = {
    "link1": ("", "the link between the hosts down for 1 s"),
    "link30": ("", "the link between the hosts down for 30 s"),
    "hoststop": ("", f"every process of host 1 stopped (SIGSTOP) for {2 * TIMEOUT_S} s"),
    "kill9pp": ("--pp 2", "kill -9 of a host-1 rank during dp 2 x pp 2 training (pipeline sends)"),
    "kill9zero3": ("--zero 3", "kill -9 of a host-1 rank during ZeRO-3 training (gathers)"),
    "killsave": ("--zero 3", "kill -9 of a host-1 rank while a sharded checkpoint is written"),
}
for k in KINDS:
    if k not in SETUP:
        sys.exit(f"faults.sh: unknown cross-host fault kind {k} (known: {','.join(SETUP)})")

def sh(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)

def cleanup_cluster():
    for h in (0, 1):
        pids = sh(["ip", "netns", "pids", f"{P}{h}"]).stdout.split()
        for q in pids:
            try:
                os.kill(int(q), signal.SIGCONT)
                os.kill(int(q), signal.SIGKILL)
            except (OSError, ValueError):
                pass
    for n in os.listdir("/dev/shm"):
        if n.startswith(f"vader_segment.{P}"):
            try:
                os.unlink(os.path.join("/dev/shm", n))
            except OSError:
                pass

def teardown():
    cleanup_cluster()
    sh([CL, "down"])

with open(os.path.join(work, "text.txt"), "w") as f:
    for name in sorted(os.listdir("docs")):
        if name.endswith(".md"):
            f.write(open(os.path.join("docs", name)).read())
r = sh([LOOM, "data", "prepare", "--input", os.path.join(work, "text.txt"), "--out", os.path.join(work, "data"),
        "--val-fraction", "0"])
if r.returncode:
    sys.exit("faults.sh: data prepare failed:\n" + r.stdout)
r = sh([CL, "up"])
if r.returncode:
    sys.exit("faults.sh: scripts/netns-cluster.sh up failed (root and network namespaces needed):\n" + r.stdout)

def train_cmd(flags, ck, log):
    return [CL, "mpirun", "-np", "4", "-x", f"LOOM_TIMEOUT_S={TIMEOUT_S}", "-x", "OMP_NUM_THREADS=1",
            LOOM, "train", "--train-data", os.path.join(work, "data", "train_*.bin"),
            "--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--seq-len", "16", "--batch-size", "2",
            "--total-batch-size", "128", "--lr", "1e-2", "--warmup", "2", "--threads", "1", "--peak-flops", "1e10",
            "--steps", str(STEPS), "--save-dir", ck, "--save-every", str(SAVE_EVERY), "--keep-checkpoints", "2",
            "--resume", "--log", log, "--print-every", "1000"] + flags.split()

STEP_RE = re.compile(r'^\{"step":(\d+),')

def last_step(path):
    n = 0
    try:
        for line in open(path):
            m = STEP_RE.match(line)
            if m:
                n = max(n, int(m.group(1)))
    except OSError:
        pass
    return n

def committed(ck):
    try:
        return max([int(d[5:]) for d in os.listdir(ck) if re.fullmatch(r"step_\d{8}", d)] or [0])
    except OSError:
        return 0

def final_identical(ref, ck):
    a, b = os.path.join(ref, f"step_{STEPS:08d}"), os.path.join(ck, f"step_{STEPS:08d}")
    try:
        names = sorted(n for n in os.listdir(a) if n.endswith(".safetensors"))
        return bool(names) and all(open(os.path.join(a, n), "rb").read() == open(os.path.join(b, n), "rb").read()
                                   for n in names)
    except OSError:
        return False

class Run:
    """mpirun in the background; every output line kept with the time it arrived."""
    def __init__(self, cmd):
        self.lines, self.t0 = [], time.time()
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  errors="replace", start_new_session=True)
        self.th = threading.Thread(target=self._read, daemon=True)
        self.th.start()
    def _read(self):
        for line in self.p.stdout:
            self.lines.append((time.time(), line))
    def wait(self, timeout):
        try:
            self.p.wait(timeout=timeout)
            hung = False
        except subprocess.TimeoutExpired:
            hung = True
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
        self.th.join(5)
        return hung
    def first(self, pattern, after):
        for t, line in self.lines:
            if t >= after and re.search(pattern, line):
                return t, line.strip()
        return None, None
    def text(self):
        return "".join(l for _, l in self.lines)

refs = {}
try:
    for flags in sorted({SETUP[k][0] for k in KINDS}):
        ref = os.path.join(work, "ref" + flags.replace(" ", "").replace("-", "_"))
        run = Run(train_cmd(flags, ref, ref + ".jsonl"))
        if run.wait(600) or run.p.returncode or committed(ref) != STEPS:
            sys.exit(f"faults.sh: the uninterrupted run {flags or '(dp 4)'} failed ({run.p.returncode}):\n"
                     + run.text()[-3000:])
        refs[flags] = ref
        cleanup_cluster()

    print(f"# cross-host faults: {N} trials per kind, 2 hosts x 2 ranks (scripts/netns-cluster.sh, namespaces {P}*), "
          f"{STEPS} steps, a checkpoint every {SAVE_EVERY}, LOOM_TIMEOUT_S={TIMEOUT_S}")
    print(f"{'trial':>5} {'fault':>10} {'at_step':>7} {'detected':>9} {'detect_s':>8} {'exit_s':>7} {'lost':>4} "
          f"{'resumed':>8}  note")
    summary = {}
    trial = 0
    for kind in KINDS:
        flags = SETUP[kind][0]
        s = summary[kind] = dict(detected=0, max_s=0.0, hangs=0, lost=0, identical=0, n=0)
        for i in range(N):
            trial += 1
            tdir = os.path.join(work, f"t{trial}")
            os.makedirs(tdir)
            ck, log = os.path.join(tdir, "ck"), os.path.join(tdir, "log.jsonl")
            note = ""
            run = Run(train_cmd(flags, ck, log))
            deadline = time.time() + 300
            if kind == "killsave":
                nth = rng.randrange(2, max(3, STEPS // SAVE_EVERY))
                target = os.path.join(ck, f".tmp-step_{nth * SAVE_EVERY:08d}")
                while run.p.poll() is None and time.time() < deadline and not os.path.exists(target) \
                        and committed(ck) < nth * SAVE_EVERY:
                    time.sleep(0.0005)
                if not os.path.exists(target):
                    note = "save had finished;"
            else:
                at = rng.randrange(SAVE_EVERY + 2, STEPS * 3 // 4)
                while run.p.poll() is None and time.time() < deadline and last_step(log) < at:
                    time.sleep(0.005)
            at_step, before = last_step(log), committed(ck)
            if run.p.poll() is not None:
                run.wait(10)
                print(f"{trial:>5} {kind:>10} {at_step:>7} {'-':>9} {'-':>8} {'-':>7} {'-':>4} {'-':>8}  "
                      f"the job ended before the fault (exit {run.p.returncode})", flush=True)
                cleanup_cluster()
                continue
            t0 = time.time()
            if kind in ("link1", "link30"):
                secs = 1 if kind == "link1" else 30
                sh(["ip", "-n", f"{P}1", "link", "set", f"{P}e1", "down"])
                time.sleep(secs)
                sh(["ip", "-n", f"{P}1", "link", "set", f"{P}e1", "up"])
            elif kind == "hoststop":
                pids = sh(["ip", "netns", "pids", f"{P}1"]).stdout.split()
                for q in pids:
                    os.kill(int(q), signal.SIGSTOP)
                time.sleep(2 * TIMEOUT_S)
                for q in pids:
                    try:
                        os.kill(int(q), signal.SIGCONT)
                    except OSError:
                        pass
            else:
                victim = None
                for q in sh(["ip", "netns", "pids", f"{P}1"]).stdout.split():
                    try:
                        if b" train " in open(f"/proc/{q}/cmdline", "rb").read().replace(b"\0", b" "):
                            victim = int(q)
                            break
                    except OSError:
                        pass
                if victim is None:
                    note += " no host-1 rank found;"
                else:
                    os.kill(victim, signal.SIGKILL)
            hung = run.wait(120)
            exit_s = time.time() - t0
            text = run.text()
            # Detected: a loom rank names host 1 (the one it waited on), or mpirun names the rank killed
            # on host 1's address; a short outage may also ride through (the job ends normally).
            rode = kind == "link1" and run.p.returncode == 0 and committed(ck) == STEPS
            if kind.startswith("kill"):
                td, line = run.first(r"exited on signal 9|" + re.escape(f"on host {P}1)"), t0)
                named = td is not None and (HOST1_ADDR in text or f"{P}1" in text)
            else:
                td, line = run.first(re.escape(f"on host {P}1)") + r"|" + re.escape(HOST1_ADDR), t0)
                named = td is not None
            detected = rode or (run.p.returncode != 0 and named)
            detect_s = 0.0 if rode else (td - t0 if td else float("inf"))
            if hung:
                note += " HANG: mpirun still running 120 s after the fault;"
            # Resume from the last good checkpoint (unless the job rode through), then compare the final
            # checkpoint with the uninterrupted run's.
            cleanup_cluster()
            resumed_from = STEPS if rode else None
            if not rode:
                rr = Run(train_cmd(flags, ck, os.path.join(tdir, "resume.jsonl")))
                rr.wait(600)
                m = re.search(r"resumed from .* at step (\d+)", rr.text())
                resumed_from = int(m.group(1)) if m else None
                if rr.p.returncode:
                    note += f" resume exit {rr.p.returncode};"
                cleanup_cluster()
            lost = int(resumed_from is None or resumed_from < before)
            same = final_identical(refs[flags], ck)
            if rode:
                note += " rode through;"
            elif resumed_from is not None:
                note += f" committed {before} before the fault, resumed from {resumed_from};"
            if not detected:
                note += f" NOT DETECTED (exit {run.p.returncode});"
            s["n"] += 1
            s["detected"] += detected
            s["hangs"] += hung
            s["lost"] += lost
            s["identical"] += same
            if detect_s > s["max_s"]:
                s["max_s"] = detect_s
            print(f"{trial:>5} {kind:>10} {at_step:>7} {'yes' if detected else 'NO':>9} {detect_s:>8.2f} {exit_s:>7.1f} "
                  f"{lost:>4} {'same' if same else 'DIFF':>8}  {note.strip()}", flush=True)
            shutil.rmtree(tdir, ignore_errors=True)
    print("# per fault kind: detected, max time to detection (s), hangs, checkpoints lost or damaged, resumed bit-identical")
    for kind in KINDS:
        s = summary[kind]
        print(f"# {kind:>10}: {s['detected']}/{s['n']} detected, max {s['max_s']:.2f} s, {s['hangs']} hangs, "
              f"{s['lost']} lost, {s['identical']}/{s['n']} identical  ({SETUP[kind][1]})")
finally:
    teardown()
    if os.environ.get("KEEP") == "1":
        print(f"# work directory kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
EOF
fi
exec /usr/bin/python3 - "$@" <<'EOF'
import os, random, re, shutil, signal, subprocess, sys, tempfile, time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 10
NP = int(os.environ.get("NP", "2"))
STEPS = int(os.environ.get("STEPS", "200"))
SAVE_EVERY = int(os.environ.get("SAVE_EVERY", "20"))
FAULTS = os.environ.get("FAULTS", "kill9,sigstop,killsave").split(",")
rng = random.Random(int(os.environ.get("SEED", "1")))
LOOM = os.path.abspath("build/loom")
work = tempfile.mkdtemp(prefix="loom-faults.")

def sh(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)

with open(os.path.join(work, "text.txt"), "w") as f:
    for name in sorted(os.listdir("docs")):
        if name.endswith(".md"):
            f.write(open(os.path.join("docs", name)).read())
r = sh([LOOM, "data", "prepare", "--input", os.path.join(work, "text.txt"), "--out",
        os.path.join(work, "data"), "--val-fraction", "0"])
if r.returncode:
    sys.exit("faults.sh: data prepare failed:\n" + r.stdout)

def train_cmd(ck, log, resume=False):
    cmd = [LOOM, "run", "--nproc-per-node", str(NP), LOOM, "train",
           "--train-data", os.path.join(work, "data", "train_*.bin"), "--steps", str(STEPS),
           "--seq-len", "64", "--batch-size", "2", "--threads", "1", "--peak-flops", "1e11",
           "--save-dir", ck, "--save-every", str(SAVE_EVERY), "--log", log, "--print-every", "1000"]
    return cmd + (["--resume"] if resume else [])

def env_for(job):
    e = dict(os.environ)
    e.update(OMP_NUM_THREADS="1", LOOM_JOB_ID=job)
    for k in ("LOOM_RUN_JOB_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        e.pop(k, None)
    return e

STEP_RE = re.compile(r'^\{"step":(\d+),"loss":([^,]+),')

def losses(path):
    out = {}
    try:
        for line in open(path):
            m = STEP_RE.match(line)
            if m:
                out[int(m.group(1))] = m.group(2)
    except OSError:
        pass
    return out

def last_step(path):
    s = losses(path)
    return max(s) if s else 0

def rank_pids(run_pid):
    """{rank: pid} of loom run's children."""
    pids = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            stat = open(f"/proc/{p}/stat").read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            if ppid != run_pid:
                continue
            env = open(f"/proc/{p}/environ", "rb").read().split(b"\0")
        except (OSError, ValueError):
            continue
        for kv in env:
            if kv.startswith(b"RANK="):
                pids[int(kv[5:])] = int(p)
    return pids

def job_processes(job):
    """pids of live processes (not zombies) whose environment names the job."""
    found, tag = [], f"LOOM_JOB_ID={job}".encode()
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

def segments(job):
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"loom-{job}@")]

# The uninterrupted reference.
ref_log = os.path.join(work, "ref.jsonl")
r = sh(train_cmd(os.path.join(work, "ref_ck"), ref_log), env=env_for(f"faultsref{os.getpid()}"), timeout=600)
ref = losses(ref_log)
if r.returncode or len(ref) != STEPS:
    sys.exit(f"faults.sh: the reference run failed ({r.returncode}, {len(ref)} steps):\n" + r.stdout[-3000:])

print(f"# {N} trials, {NP} ranks, {STEPS} steps, a checkpoint every {SAVE_EVERY}; faults {','.join(FAULTS)}")
print(f"{'trial':>5} {'fault':>8} {'rank':>4} {'at_step':>7} {'detected':>8} {'exit_s':>7} {'leftovers':>9} "
      f"{'resumed':>8}  note")
tot = dict(detected=0, fast=0, hangs=0, leftovers=0, identical=0)
for t in range(1, N + 1):
    fault, victim = rng.choice(FAULTS), rng.randrange(NP)
    job = f"faults{os.getpid()}-{t}"
    tdir = os.path.join(work, f"t{t}")
    os.makedirs(tdir)
    ck, log, out_path = os.path.join(tdir, "ck"), os.path.join(tdir, "log.jsonl"), os.path.join(tdir, "out.txt")
    note = ""
    with open(out_path, "w") as out:
        run = subprocess.Popen(train_cmd(ck, log), env=env_for(job), stdout=out, stderr=subprocess.STDOUT)
        # When to strike: a random step, or the moment a random save starts.
        if fault == "killsave":
            nth = rng.randrange(1, max(2, STEPS // SAVE_EVERY))
            target_tmp = os.path.join(ck, f".tmp-step_{nth * SAVE_EVERY:08d}")
            deadline = time.time() + 120
            while run.poll() is None and time.time() < deadline:
                if os.path.exists(target_tmp) or last_step(log) > nth * SAVE_EVERY:
                    break
                time.sleep(0.0005)
        else:
            at = rng.randrange(2, STEPS * 3 // 4)
            deadline = time.time() + 120
            while run.poll() is None and time.time() < deadline and last_step(log) < at:
                time.sleep(0.005)
        at_step = last_step(log)
        pids = rank_pids(run.pid)
        if run.poll() is not None or victim not in pids:
            note = "the job ended before the fault"
            run.wait()
            print(f"{t:>5} {fault:>8} {victim:>4} {at_step:>7} {'-':>8} {'-':>7} {'-':>9} {'-':>8}  {note}")
            continue
        t0 = time.time()
        os.kill(pids[victim], signal.SIGSTOP if fault == "sigstop" else signal.SIGKILL)
        try:
            run.wait(timeout=60)
            exit_s = time.time() - t0
        except subprocess.TimeoutExpired:
            exit_s = float("inf")
            tot["hangs"] += 1
            run.kill()
            run.wait()
            note = "HANG: loom run still running after 60 s;"
    if fault == "killsave":
        note = "save interrupted" if os.path.exists(target_tmp) else "save had finished"
    text = open(out_path, errors="replace").read()
    m = re.search(r"first failure: rank (\d+)", text)
    detected = m is not None and int(m.group(1)) == victim
    if not detected:
        note += (" " if note else "") + ("first failure: rank " + m.group(1) if m else "no first failure named")
    time.sleep(0.2)  # the kernel finishes tearing the ranks down
    left = len(segments(job)) + len(job_processes(job))
    for p in job_processes(job):  # do not let one trial disturb the next
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    for n in segments(job):
        os.unlink(os.path.join("/dev/shm", n))
    # Resume from the last complete checkpoint and compare every step it logs with the reference.
    rlog = os.path.join(tdir, "resume.jsonl")
    r = sh(train_cmd(ck, rlog, resume=True), env=env_for(job + "r"), timeout=600)
    got = losses(rlog)
    same = r.returncode == 0 and got and max(got) == STEPS and all(ref.get(s) == v for s, v in got.items())
    if not same:
        bad = [s for s, v in sorted(got.items()) if ref.get(s) != v][:3]
        note += (" " if note else "") + f"resume: exit {r.returncode}, {len(got)} steps, differing {bad}"
    tot["detected"] += detected
    tot["fast"] += detected and exit_s <= 2
    tot["leftovers"] += left
    tot["identical"] += bool(same)
    print(f"{t:>5} {fault:>8} {victim:>4} {at_step:>7} {'yes' if detected else 'NO':>8} {exit_s:>7.2f} {left:>9} "
          f"{'same' if same else 'DIFF':>8}  {note}", flush=True)
print(f"# summary: {tot['detected']}/{N} detected naming the rank, {tot['fast']}/{N} within 2 s, "
      f"{tot['hangs']} hangs, {tot['leftovers']} leftovers, {tot['identical']}/{N} resumes bit-identical")
if os.environ.get("KEEP") == "1":
    print(f"# work directory kept: {work}")
else:
    shutil.rmtree(work, ignore_errors=True)
EOF
