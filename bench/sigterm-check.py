#!/usr/bin/env python3
"""SIGTERM at random moments of a real fabric-agent run, on a GPU host: every stop must end
the agent with exit 143 (no segmentation fault, no core), within 2 s, with a termination
message that names the phase in words.

    python3 bench/sigterm-check.py AGENT [CHECKS] [PAIRS] [PROBES]   (default 20 5 5)

- node-check: the default suite on every GPU, SIGTERM at a uniform random moment between
  0.3 s and the length of a clean check (measured first, once, uninterrupted);
- node-pair: two ranks on one host (GPUs split in halves, rendezvous on loopback), SIGTERM to
  one rank (random) at a random moment of the pair's length;
- ddp-nodes: likewise, two ranks.
On a host of one GPU both ranks share it, each with its own NCCL_HOSTID (two nodes to NCCL).
Prints one row per stop and a summary; writes sigterm.json (every row) into $OUT.
The seed is printed; SIGTERM_SEED=N repeats a series.
"""

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

AGENT = sys.argv[1]
CHECKS, PAIRS, PROBES = (int(a) for a in (sys.argv[2:5] + ["20", "5", "5"][len(sys.argv[2:5]):]))
OUT = os.environ.get("OUT", ".")
SEED = int(os.environ.get("SIGTERM_SEED", str(int(time.time()))))
rng = random.Random(SEED)
ENV = dict(os.environ, NCCL_NVLS_ENABLE="0")
GPUS = int(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.count("GPU "))
HALF = max(GPUS // 2, 1)
rows = []


def visible(lo, n):
    return ",".join(str(i) for i in range(lo, lo + n))


def rank_env(r):
    """A rank's GPUs: half the host's each; on a host of one GPU both ranks share it, each
    with a host id of its own so that NCCL takes them for two nodes (sockets over loopback)
    and does not refuse one GPU twice in a communicator."""
    if GPUS < 2:
        return {"CUDA_VISIBLE_DEVICES": "0", "NCCL_HOSTID": f"sigterm-rank-{r}"}
    return {"CUDA_VISIBLE_DEVICES": visible(r * HALF, HALF)}


def start(args, env_extra, tmp, tag):
    term = os.path.join(tmp, f"{tag}.term")
    open(term, "w").close()
    env = dict(ENV, FABRIC_TERMINATION_LOG=term, **env_extra)
    log = open(os.path.join(tmp, f"{tag}.log"), "w")
    p = subprocess.Popen([AGENT] + args, env=env, stdout=log, stderr=subprocess.STDOUT)
    return p, term, log


def ended(p, timeout):
    try:
        p.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def read(path):
    try:
        return open(path).read()
    except OSError:
        return ""


def record(kind, at, p, term, t_sig, tmp, tag):
    # Polled rather than waited: the time the stop was written (the termination message) and
    # the time the process was reaped are told apart.
    written = None
    while p.poll() is None and time.time() - t_sig < 30:
        if written is None and os.path.getsize(term) > 0:
            written = time.time() - t_sig
        time.sleep(0.01)
    stopped = p.poll() is not None
    took = time.time() - t_sig
    if written is None and os.path.getsize(term) > 0:
        written = took
    if not stopped:
        p.kill()
        p.wait()
    code = p.returncode
    # A negative code: the signal killed it (-11: a segmentation fault, with a core if allowed).
    msg = read(term)
    last_log = [l for l in read(os.path.join(tmp, f"{tag}.log")).splitlines() if l.strip()][-3:]
    phase = msg.splitlines()[0] if msg else ""
    row = {"kind": kind, "at_s": round(at, 2), "exit": code, "stop_s": round(took, 3),
           "written_s": None if written is None else round(written, 3),
           "within_2s": stopped and took <= 2.0, "ok": code == 143 and stopped and took <= 2.0,
           "phase_line": phase, "message": msg[:600], "log_tail": last_log}
    rows.append(row)
    wrote = "-" if written is None else f"{written:.2f}"
    print(f"{kind:10} SIGTERM at {at:6.2f} s: exit {code}, stop written {wrote} s, reaped {took:5.2f} s "
          f"later; {phase[:100]}",
          flush=True)
    return row


def node_check_length():
    with tempfile.TemporaryDirectory() as tmp:
        t = time.time()
        p, _, log = start(["node-check"], {}, tmp, "clean")
        p.wait()
        log.close()
        took = time.time() - t
        print(f"clean node-check: exit {p.returncode} in {took:.1f} s", flush=True)
        return took


def node_check(length):
    for i in range(CHECKS):
        at = rng.uniform(0.3, length)
        with tempfile.TemporaryDirectory() as tmp:
            p, term, log = start(["node-check"], {}, tmp, "check")
            time.sleep(at)
            t = time.time()
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            record("node-check", at, p, term, t, tmp, "check")
            log.close()


def two_ranks(kind, args_of, length, n):
    for i in range(n):
        at = rng.uniform(0.3, length)
        victim = rng.randrange(2)
        port = 29500 + rng.randrange(400)
        with tempfile.TemporaryDirectory() as tmp:
            procs = []
            for r in range(2):
                procs.append(start(args_of(r, port), rank_env(r), tmp, f"r{r}"))
            time.sleep(at)
            p, term, log = procs[victim]
            t = time.time()
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            o, _, olog = procs[1 - victim]
            # The stopped rank first: its time is from the signal to its own end, whatever
            # its peer does.
            row = record(f"{kind} r{victim}", at, p, term, t, tmp, f"r{victim}")
            # The other rank ends on its own: its peer is gone (not measured, exit 5), or it
            # had finished.
            ended(o, 30)
            if o.poll() is None:
                o.kill()
                o.wait()
            row["other_rank_exit"] = o.returncode
            row["other_rank_s"] = round(time.time() - t, 3)
            print(f"{'':10} the other rank: exit {o.returncode}, {row['other_rank_s']:.2f} s after the signal",
                  flush=True)
            log.close()
            olog.close()


def pair_args(rank, port):
    return ["node-pair", "--backend", "cuda", "--nodes", "a,b", "--group", "sigterm",
            "--secret", "0123456789abcdef0123456789abcdef", "--rendezvous", f"127.0.0.1:{port}",
            "--rank", str(rank), "--rendezvous-timeout", "10", "--timeout", "15"]


def probe_args(rank, port):
    return ["ddp-nodes", "--backend", "cuda", "--nodes", "a,b", "--group", "sigterm",
            "--secret", "0123456789abcdef0123456789abcdef", "--rendezvous", f"127.0.0.1:{port}",
            "--rank", str(rank), "--rendezvous-timeout", "10", "--timeout", "15"]


def clean_length(args_of):
    with tempfile.TemporaryDirectory() as tmp:
        t = time.time()
        port = 29950
        procs = [start(args_of(r, port), rank_env(r), tmp, f"r{r}")
                 for r in range(2)]
        for p, _, log in procs:
            p.wait()
            log.close()
        took = time.time() - t
        print(f"clean {args_of(0, port)[0]}: exits {[p.returncode for p, _, _ in procs]} in {took:.1f} s",
              flush=True)
        return took


print(f"seed {SEED}; {GPUS} GPUs; agent {AGENT}", flush=True)
if CHECKS:
    node_check(node_check_length())
if PAIRS:
    two_ranks("node-pair", pair_args, clean_length(pair_args), PAIRS)
if PROBES:
    two_ranks("ddp-nodes", probe_args, clean_length(probe_args), PROBES)
json.dump({"seed": SEED, "gpus": GPUS, "rows": rows}, open(os.path.join(OUT, "sigterm.json"), "w"), indent=1)
bad = [r for r in rows if not r["ok"]]
by = {}
for r in rows:
    by.setdefault(r["kind"].split()[0], []).append(r)
for k, rs in by.items():
    codes = {}
    for r in rs:
        codes[r["exit"]] = codes.get(r["exit"], 0) + 1
    worst = max(r["stop_s"] for r in rs)
    print(f"summary {k}: {len(rs)} stops, exit codes {codes}, slowest stop {worst:.2f} s")
print(f"{len(rows) - len(bad)} passed, {len(bad)} failed")
sys.exit(1 if bad else 0)
