#!/usr/bin/env python3
"""Runs the workspace's test binaries in lanes: `cargo test` runs one binary after another,
and most of ours spend their time waiting on an API server, a kubelet or a pod, so two
binaries at once take about half the time on two cores.

Usage: tests/lanes.py [--lanes N]   (from tests/run.sh; the binaries are built already)

Each binary runs as `cargo test` would run it: from its package's directory, with the
package's CARGO_* variables. The binaries that start a real node (kubelet and containerd:
one per machine) run one after another in one lane. Each binary's output is printed whole
when it ends, then a summary; the exit status is 1 when any binary failed. The doc tests
run last, through cargo. A binary that fails beside another runs again alone, and only its
result alone counts; the summary names every binary that needed it.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

# Binaries that start a real node. They also take the machine's real-node lock
# (tests/src/realnode/host.rs), so two at once would only wait for each other.
REAL_NODE = {"installed", "realnode", "realnode_gpus", "realnode_teardown"}

# Seconds each binary took on a two-core machine, to start the longest first (a binary
# not named here counts as 30 s). Only the order depends on these.
WEIGHTS = {
    "operator": 172, "outcomes": 113, "gpu_e2e_sim": 100, "pair_phase": 96, "ddp_nodes": 82,
    "lifecycle_edges": 71, "harness": 63, "demo": 61, "lifecycle": 59,
    "quarantine_e2e": 56, "uninstall": 53, "breaker": 41, "packaging": 40,
    "one_run_per_node": 31, "nic_counters": 31, "trend": 30, "setting_sources": 30,
    "dra": 28, "identity": 27, "operator_scale": 25, "signals": 23, "kubectl_plugin": 23,
    "nodehealthcheck": 20, "standing": 20, "packaging_upgrade": 19, "counters": 18,
    "release": 17, "kubelet": 17, "quarantine": 17,
}
DEFAULT_WEIGHT = 30


def test_binaries(root):
    """The test executables `cargo test --workspace --no-run` builds, with their packages."""
    cmd = ["cargo", "test", "--workspace", "--locked", "--no-run",
           "--message-format=json-render-diagnostics"]
    proc = subprocess.run(cmd, cwd=root, stdout=subprocess.PIPE, check=False)
    if proc.returncode != 0:
        sys.exit(f"lanes.py: {' '.join(cmd)} failed (exit {proc.returncode})")
    found = []
    for line in proc.stdout.decode("utf-8", "replace").splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        kind = target["kind"][0]
        # An integration test is named by its file; a crate's own tests by the crate.
        name = target["name"]
        label = name if kind == "test" else f"{target['name']} ({kind})"
        found.append({
            "name": name,
            "label": label,
            "exe": msg["executable"],
            "manifest": msg["manifest_path"],
            "package_id": msg["package_id"],
        })
    return found


def package_env(binary):
    """The CARGO_* variables cargo sets when it runs a test binary."""
    env = dict(os.environ)
    env.setdefault("CARGO", shutil.which("cargo") or "cargo")
    env["CARGO_MANIFEST_DIR"] = os.path.dirname(binary["manifest"])
    # package_id: "path+file:///dir#name@version" (or "...#version" when the name is the dir's).
    spec = binary["package_id"].rsplit("#", 1)[-1]
    pkg_name, _, version = spec.rpartition("@")
    if pkg_name:
        env["CARGO_PKG_NAME"] = pkg_name
    env["CARGO_PKG_VERSION"] = version or spec
    return env


class Lanes:
    def __init__(self, jobs, lanes):
        self.jobs = jobs  # each a list of binaries run one after another
        self.lanes = lanes
        self.lock = threading.Lock()
        self.results = []  # (label, passed, seconds)

    def take(self):
        with self.lock:
            return self.jobs.pop(0) if self.jobs else None

    def lane(self, number):
        while True:
            job = self.take()
            if job is None:
                return
            for binary in job:
                self.run(number, binary)

    def run(self, lane, binary):
        start = time.monotonic()
        proc = subprocess.run([binary["exe"]], cwd=os.path.dirname(binary["manifest"]),
                              env=package_env(binary), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, check=False)
        seconds = time.monotonic() - start
        passed = proc.returncode == 0
        text = proc.stdout.decode("utf-8", "replace")
        with self.lock:
            self.results.append((binary["label"], passed, seconds))
            status = "ok" if passed else f"FAILED (exit {proc.returncode})"
            sys.stdout.write(f"\n     Running {binary['label']} ({binary['exe']}) "
                             f"[{'alone' if lane == 0 else f'lane {lane}'}, {seconds:.0f} s: {status}]\n{text}")
            sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lanes", type=int, default=2,
                        help="binaries at once (default 2; 1 runs them as cargo test does)")
    args = parser.parse_args()
    if args.lanes < 1:
        sys.exit("lanes.py: --lanes must be at least 1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    binaries = test_binaries(root)
    if not binaries:
        sys.exit("lanes.py: cargo built no test binaries")
    real = [b for b in binaries if b["name"] in REAL_NODE]
    jobs = [[b] for b in binaries if b["name"] not in REAL_NODE]
    if real:
        jobs.append(real)

    def weight(job):
        return sum(WEIGHTS.get(b["name"], DEFAULT_WEIGHT if b["label"] == b["name"] else 5)
                   for b in job)

    jobs.sort(key=weight, reverse=True)
    print(f"lanes.py: {len(binaries)} test binaries in {args.lanes} lane(s)", flush=True)
    start = time.monotonic()
    lanes = Lanes(jobs, args.lanes)
    threads = [threading.Thread(target=lanes.lane, args=(n + 1,)) for n in range(args.lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [r for r in lanes.results if not r[1]]
    # A binary that failed beside another runs again alone: its tests wait on deadlines of
    # seconds, and two binaries at once on two cores can push a pod past one. It counts as
    # passed only when it passes alone, and the summary names it either way.
    alone = Lanes([[b] for b in binaries if any(b["label"] == f[0] for f in failed)], 1)
    for label, _, _ in failed:
        print(f"\nlanes.py: {label} failed beside another binary; running it again alone",
              flush=True)
    alone.lane(0)
    flaky = [r[0] for r in alone.results if r[1]]
    failed = [r for r in alone.results if not r[1]]
    doc = subprocess.run(["cargo", "test", "--workspace", "--locked", "--doc"], cwd=root,
                         check=False)
    print(f"\nlanes.py: {len(lanes.results)} binaries in {time.monotonic() - start:.0f} s, "
          f"{len(failed)} failed; the slowest: "
          + ", ".join(f"{label} {s:.0f} s" for label, _, s in
                      sorted(lanes.results, key=lambda r: -r[2])[:5]))
    for label in flaky:
        print(f"lanes.py: {label} failed beside another binary and passed alone", flush=True)
    for label, _, seconds in failed:
        print(f"lanes.py: FAILED {label} ({seconds:.0f} s): its output is above", flush=True)
    if doc.returncode != 0:
        print("lanes.py: the doc tests FAILED", flush=True)
    sys.exit(1 if failed or doc.returncode != 0 else 0)


if __name__ == "__main__":
    main()
