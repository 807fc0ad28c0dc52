#!/usr/bin/env python3
"""The user's side of bench/gpu-e2e.sh: FabricTests applied over the API server's REST API
(no kubectl needed), and what the operator decided read back from the API (runs, nodes,
Events) and from its /metrics, with the time each step took.

    python3 bench/gpu-e2e.py STEP...

Steps, in order: `setup` (CRDs, the pod namespace, and what kube-controller-manager does for
it: the namespace's ServiceAccount, the not-ready taint lifted from the new nodes), `clean`,
then for each hardware fault `fault:KIND` and `release:KIND` (one FabricTest over the GPU
host; KIND hidden-gpu or sdc), `pairs` and `probe` (FabricTests over the emulated nodes:
node pairs with a shaped link, the multi-node DDP probe), `blocks` (the multi-node NCCL sweep
over three topology blocks, the path inside one slowed), `table`. Each step
appends its rows to $E2E_JSON, so a step that fails leaves the earlier ones' results.

Environment (bench/gpu-e2e.sh sets it): E2E_API (https://127.0.0.1:PORT), E2E_PKI (ca.crt,
admin.crt, admin.key), E2E_METRICS (http://127.0.0.1:PORT/metrics of the operator), E2E_HOST
(the GPU host's node), E2E_EMULATED (the emulated nodes, comma-separated), E2E_SHAPED (the
emulated node whose link is shaped), E2E_SHAPE_CMD (the command that shapes it),
E2E_UNSHAPE_CMD and E2E_SHAPE_PATH_CMD (the blocks' step: the limit off, one path slowed), E2E_GPUS (the
host's GPU count), E2E_NODE_FAULT (the file the host's agent wrapper reads its fault from),
E2E_SIM=1 (dry run: the faults and the shaped link are written into the sim fleet file
E2E_FLEET instead), E2E_JSON, E2E_DEADLINE (epoch
seconds by which every wait gives up, so the report is always written).
"""

import datetime
import json
import os
import subprocess
import sys
import time

import requests
import urllib3
import yaml

urllib3.disable_warnings()

GROUP = "gpufabric.io"
VERSION = "v1alpha1"
NS = "gpufabric"
ROLE_LABEL = "e2e.gpufabric.io/role"
TEST_HOST = "e2e-host"
TEST_NODES = "e2e-nodes"
CONDITION = "GPUFabricDegraded"  # True: a confirmed problem
RESULT_LABEL = "gpufabric.io/result"
QUARANTINE_ANN = "gpufabric.io/quarantine"
QUARANTINE_LABEL = "gpufabric.io/quarantined"
RUN_NOW = "gpufabric.io/run-now"
NOT_READY = "node.kubernetes.io/not-ready"

ENV = os.environ
API = ENV.get("E2E_API", "")
PKI = ENV.get("E2E_PKI", "")
SIM = ENV.get("E2E_SIM") == "1"
HOST = ENV.get("E2E_HOST", "")
EMULATED = [n for n in ENV.get("E2E_EMULATED", "").split(",") if n]
SHAPED = ENV.get("E2E_SHAPED", "")
JSON_PATH = ENV.get("E2E_JSON", "gpu-e2e.json")
DEADLINE = float(ENV.get("E2E_DEADLINE", time.time() + 3600))
GPUS = int(ENV.get("E2E_GPUS", "0") or 0)
# Where the GPU host's agent reads the fault made on the node's side (bench/gpu-e2e.sh's
# wrapper): nothing in a FabricTest's spec chooses it.
NODE_FAULT = ENV.get("E2E_NODE_FAULT", "")
LAST = max(GPUS - 1, 0)
# E2E_DRA=1: the host's GPUs are DRA devices as well. A fault of one GPU (sdc) on a host of two
# or more is then that GPU's, tainted by a DeviceTaintRule while the node stays in service
# (docs/node-lifecycle.md); with one GPU, more than half the node's GPUs, the node is cordoned.
DRA = ENV.get("E2E_DRA") == "1"
TAINT_RULES = "/apis/resource.k8s.io/v1alpha3/devicetaintrules"


def gpu_level(kind):
    return DRA and kind == "sdc" and GPUS >= 2


def rules_on_last_gpu():
    """gpufabric's DeviceTaintRules on the faulty GPU (the last one), by device name."""
    items = (get(TAINT_RULES, missing_ok=True) or {}).get("items", [])
    return [r["metadata"]["name"] for r in items
            if r["metadata"]["name"].startswith("gpufabric-")
            and (r.get("spec", {}).get("deviceSelector") or {}).get("device") == f"gpu-{LAST}"]
# The hardware faults the product must fail, each made outside the test's spec:
#   hidden-gpu: a GPU the pod cannot see although the node advertises it (CUDA_VISIBLE_DEVICES
#     set by the node's side; in the dry run, the sim node's GPU count lowered);
#   sdc: a wrong result in the silent-data-corruption check (the agent's hidden test hook,
#     FABRIC_TEST_FLIP_SDC_BIT, set by the node's side; in the dry run, the sim's sdc fault).
FAULTS = {
    "hidden-gpu": f"GPU {LAST} hidden from the pod while the node advertises {GPUS} (node side, not the spec)",
    "sdc": f"one bit of GPU {LAST}'s SDC output flipped (node side, not the spec)",
}

# E2E_NODE=real: the host is a real node (kubelet, containerd, the GPU device plugin) running
# the agent image E2E_AGENT_IMAGE.
REAL = ENV.get("E2E_NODE") == "real"
AGENT_IMAGE = ENV.get("E2E_AGENT_IMAGE", "")

S = requests.Session()
# Given with every request: a session's own `verify` loses to $REQUESTS_CA_BUNDLE.
TLS = {"verify": os.path.join(PKI, "ca.crt"),
       "cert": (os.path.join(PKI, "admin.crt"), os.path.join(PKI, "admin.key"))} if PKI else {}


def log(msg):
    print(f"[e2e {datetime.datetime.now(datetime.timezone.utc):%H:%M:%S}] {msg}", flush=True)


def req(method, path, body=None, ctype="application/json", ok=(200, 201)):
    r = S.request(method, API + path, data=None if body is None else json.dumps(body),
                  headers={"Content-Type": ctype}, timeout=30, **TLS)
    if r.status_code not in ok:
        raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:400]}")
    return r.json() if r.text else {}


def get(path, missing_ok=False):
    r = S.get(API + path, timeout=30, **TLS)
    if r.status_code == 404 and missing_ok:
        return None
    if r.status_code != 200:
        raise RuntimeError(f"GET {path}: {r.status_code} {r.text[:400]}")
    return r.json()


def merge_patch(path, body):
    return req("PATCH", path, body, ctype="application/merge-patch+json")


def ft_path(name=""):
    return f"/apis/{GROUP}/{VERSION}/fabrictests" + (f"/{name}" if name else "")


def runs_of(test):
    items = get(f"/apis/{GROUP}/{VERSION}/fabrictestruns?labelSelector=gpufabric.io/test%3D{test}")["items"]
    return sorted(items, key=lambda r: r["metadata"]["creationTimestamp"])


def node(name):
    return get(f"/api/v1/nodes/{name}")


def condition(n, ctype=CONDITION):
    for c in n.get("status", {}).get("conditions", []):
        if c.get("type") == ctype:
            return c
    return None


def node_events(name):
    out = []
    for e in get("/apis/events.k8s.io/v1/events").get("items", []):
        reg = e.get("regarding") or {}
        if reg.get("kind") == "Node" and reg.get("name") == name:
            out.append({"reason": e.get("reason"), "type": e.get("type"), "note": e.get("note"),
                        "time": e.get("eventTime"), "controller": e.get("reportingController")})
    return out


def metrics(node_name):
    url = ENV.get("E2E_METRICS")
    if not url:
        return []
    try:
        text = requests.get(url, timeout=10).text
    except Exception as e:  # the operator's admin port not answering is reported, not fatal
        return [f"(no /metrics: {e})"]
    return [line for line in text.splitlines()
            if line.startswith("gpufabric_node_") and f'node="{node_name}"' in line]


def shards_of(run_name):
    return get(f"/apis/{GROUP}/{VERSION}/fabrictestrunshards?labelSelector=gpufabric.io/run%3D{run_name}")["items"]


def verdict_of(run, name):
    for n in run.get("status", {}).get("nodes", []):
        if n.get("node") == name:
            return n
    return None


def finished(run):
    return run.get("status", {}).get("phase") in ("Succeeded", "Failed")


def secs(t0):
    return round(time.time() - t0, 1)


# ---- the record of the run -------------------------------------------------------------

def load():
    try:
        with open(JSON_PATH) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"rows": [], "details": {}}


def save(doc):
    with open(JSON_PATH, "w") as f:
        json.dump(doc, f, indent=1, default=str)


def row(doc, step, applied, decided, took, ok, **detail):
    doc["rows"].append({"step": step, "applied": applied, "decided": decided, "took": took,
                        "ok": ok})
    if detail:
        doc["details"][step] = detail
    save(doc)
    log(f"{'OK ' if ok else 'NOT OK'} {step}: {decided} ({took})")


def wait(what, pred, timeout, every=0.5):
    """Polls pred() until it returns something truthy, or timeout / the run's deadline."""
    end = min(time.time() + timeout, DEADLINE)
    last_err = None
    while time.time() < end:
        try:
            v = pred()
            if v:
                return v
        except Exception as e:  # an API hiccup is retried until the deadline
            last_err = e
        time.sleep(every)
    log(f"gave up waiting for {what}" + (f" (last error: {last_err})" if last_err else ""))
    return None


# ---- steps -----------------------------------------------------------------------------

def step_setup(doc):
    t0 = time.time()
    crd_dir = ENV.get("E2E_CRDS", "crds")
    names = []
    for f in sorted(os.listdir(crd_dir)):
        if not f.endswith(".yaml"):
            continue
        obj = yaml.safe_load(open(os.path.join(crd_dir, f)))
        name = obj["metadata"]["name"]
        req("PATCH", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}?fieldManager=gpu-e2e&force=true",
            obj, ctype="application/apply-patch+yaml")
        names.append(name)

    def established():
        for n in names:
            crd = get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}")
            if not any(c["type"] == "Established" and c["status"] == "True"
                       for c in crd.get("status", {}).get("conditions", [])):
                return False
        return True

    wait("CRDs established", established, 60)
    # Pod Security "restricted" enforced, as the chart does: every benchmark pod the operator
    # builds by default must be admitted under it.
    psa = {f"pod-security.kubernetes.io/{m}": "restricted" for m in ("enforce", "warn")}
    req("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": NS, "labels": psa}}, ok=(200, 201, 409))
    t_ns = time.time()
    sa = wait("the namespace's default ServiceAccount (kube-controller-manager)",
              lambda: get(f"/api/v1/namespaces/{NS}/serviceaccounts/default", missing_ok=True), 90)
    sa_s = secs(t_ns)
    row(doc, "CRDs, pod namespace",
        f"{len(names)} CRDs (server-side apply), namespace {NS}",
        f"ServiceAccount {NS}/default created by kube-controller-manager after {sa_s} s"
        if sa else "no ServiceAccount: pods would be refused", f"{secs(t0)} s", bool(sa))

    t_reg = float(ENV.get("E2E_KUBELET_START", t0))
    all_nodes = [HOST] + EMULATED
    tainted = set()

    def nodes_ready():
        out = {}
        for n in all_nodes:
            o = get(f"/api/v1/nodes/{n}", missing_ok=True)
            if not o:
                return None
            ready = (condition(o, "Ready") or {}).get("status") == "True"
            taints = [t["key"] for t in o.get("spec", {}).get("taints", []) or []]
            if NOT_READY in taints:
                tainted.add(n)
            if not ready or NOT_READY in taints:
                return None
            if REAL and n == HOST and o["status"].get("allocatable", {}).get("nvidia.com/gpu") != str(GPUS):
                return None  # the device plugin has not registered its GPUs yet
            out[n] = {"labels": {k: v for k, v in o["metadata"]["labels"].items()
                                 if k.startswith(("nvidia.com/", "e2e."))},
                      "gpus": o["status"]["allocatable"].get("nvidia.com/gpu"),
                      "taints": taints}
        return out

    ready = wait("nodes Ready without the not-ready taint", nodes_ready, 120)
    h = (ready or {}).get(HOST, {}).get("labels", {})
    row(doc, "nodes registered",
        f"{'kubelet, containerd, GPU device plugin' if REAL else 'fabric-kubelet'}: "
        f"{HOST} ({h.get('nvidia.com/gpu.count', '?')} x "
        f"{h.get('nvidia.com/gpu.product', '?')}), emulated {', '.join(EMULATED) or 'none'} (1 GPU each)",
        (f"Ready; the not-ready taint (seen on {len(tainted)} of {len(all_nodes)} nodes here) "
         "lifted by kube-controller-manager's node lifecycle controller")
        if ready else "not Ready, or the not-ready taint still on",
        f"{round(time.time() - t_reg, 1)} s from the kubelet's start", bool(ready), nodes=ready,
        not_ready_taint_seen=sorted(tainted))
    if not ready:
        raise SystemExit("nodes not ready")


def host_test():
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "FabricTest",
        "metadata": {"name": TEST_HOST},
        "spec": {
            "nodeSelector": {ROLE_LABEL: "host"},
            "quarantine": {"mode": "Cordon", "maxQuarantined": 1, "confirmRetest": True,
                           "failuresToQuarantine": 1, "passesToRelease": 1},
            "agent": {"timeoutSeconds": 300},
        },
    }


def node_facts(name):
    n = node(name)
    c = condition(n) or {}
    return {
        "unschedulable": bool(n.get("spec", {}).get("unschedulable")),
        "result_label": n["metadata"].get("labels", {}).get(RESULT_LABEL),
        "quarantine_label": n["metadata"].get("labels", {}).get(QUARANTINE_LABEL),
        "quarantine_record": n["metadata"].get("annotations", {}).get(QUARANTINE_ANN),
        "condition": {k: c.get(k) for k in ("status", "reason", "message")} if c else None,
    }


def numbers(v):
    if not v:
        return "no result"
    parts = [v.get("verdict", "?")]
    if v.get("allReduceBusBwGbps") is not None:
        parts.append(f"all_reduce {v['allReduceBusBwGbps']:.0f} GB/s")
    if v.get("minPairGbps") is not None:
        parts.append(f"min pair {v['minPairGbps']:.0f} GB/s")
    if v.get("ddpEfficiency") is not None:
        parts.append(f"DDP {v['ddpEfficiency']:.3f}")
    return ", ".join(parts)


def new_runs(test, before):
    return [r for r in runs_of(test) if r["metadata"]["name"] not in before]


def step_clean(doc):
    t0 = time.time()
    req("POST", ft_path(), host_test())
    log(f"applied FabricTest {TEST_HOST} over {HOST}")
    run = wait("the clean run", lambda: next((r for r in runs_of(TEST_HOST) if finished(r)), None), 400)
    took = secs(t0)
    v = verdict_of(run, HOST) if run else None
    # The node's signals (condition, label) are written right after the verdict.
    wait("the node's condition", lambda: (node_facts(HOST)["condition"] or {}).get("status"), 20)
    facts = node_facts(HOST)
    m = metrics(HOST)
    ok = bool(v) and v.get("verdict") == "Passed" and (facts["condition"] or {}).get("status") == "False"
    decided = (f"run {run['metadata']['name']}: {numbers(v)}; condition {CONDITION}="
               f"{(facts['condition'] or {}).get('status')}, label {RESULT_LABEL}={facts['result_label']}"
               if run else "no finished run")
    # E2E_CLEAN_REPEATS=N: N-1 more clean runs (run-now), each verdict kept, so that two
    # runs of this script compare medians rather than single samples (bench/e2e-compare.py).
    repeats = int(ENV.get("E2E_CLEAN_REPEATS", "1"))
    verdicts = [v] if v else []
    for i in range(1, repeats):
        before = {r["metadata"]["name"] for r in runs_of(TEST_HOST)}
        merge_patch(ft_path(TEST_HOST), {"metadata": {"annotations": {
            RUN_NOW: datetime.datetime.now(datetime.timezone.utc).isoformat()}}})
        again = wait(f"clean run {i + 1} of {repeats}",
                     lambda: next((r for r in new_runs(TEST_HOST, before) if finished(r)), None), 300)
        va = verdict_of(again, HOST) if again else None
        ok = ok and bool(va) and va.get("verdict") == "Passed"
        if va:
            verdicts.append(va)
            log(f"clean run {i + 1} of {repeats}: {numbers(va)}")
    if repeats > 1:
        decided += f"; {len(verdicts)} clean runs, all Passed: {ok}"
    row(doc, "clean test", f"FabricTest {TEST_HOST} (Cordon, confirmRetest, passesToRelease 1)",
        decided, f"apply -> verdict {took} s (run {run.get('status', {}).get('duration') if run else '-'})",
        ok, verdict=v, verdicts=verdicts, node=facts, metrics=m, run_status=(run or {}).get("status"))


def set_fault(kind):
    """Makes the fault `kind` on the GPU host's side (None: no fault), then asks for a run now.
    The FabricTest's spec is never changed."""
    if SIM:
        path = ENV["E2E_FLEET"]
        fleet = yaml.safe_load(open(path))
        for n in fleet["nodes"]:
            if n["name"] == HOST:
                # The kubelet registered the node with GPUS; the agent reads the file anew.
                n["gpus"] = GPUS - 1 if kind == "hidden-gpu" else GPUS
                n["faults"] = [{"kind": "sdc", "gpu": LAST}] if kind == "sdc" else []
        yaml.safe_dump(fleet, open(path, "w"))
    else:
        with open(NODE_FAULT, "w") as f:
            f.write(kind or "")
    merge_patch(ft_path(TEST_HOST), {
        "metadata": {"annotations": {RUN_NOW: datetime.datetime.now(datetime.timezone.utc).isoformat()}},
    })


def step_fault(doc, kind):
    before = {r["metadata"]["name"] for r in runs_of(TEST_HOST)}
    t0 = time.time()
    set_fault(kind)
    what = FAULTS[kind] + (" (sim)" if SIM else "")
    log(f"fault {kind}: {what}; {RUN_NOW} on {TEST_HOST}")
    first = wait("the run with the fault",
                 lambda: next((r for r in new_runs(TEST_HOST, before)
                               if r["spec"]["trigger"] != "Confirmation" and finished(r)), None), 300)
    t_first = secs(t0)
    v1 = verdict_of(first, HOST) if first else None
    conf = None
    t_conf = None
    if v1 and v1.get("verdict") in ("Failed", "Errored", "Timeout"):
        conf = wait("the confirmation run",
                    lambda: next((r for r in new_runs(TEST_HOST, before)
                                  if r["spec"]["trigger"] == "Confirmation" and finished(r)), None), 300)
        t_conf = secs(t0)
    v2 = verdict_of(conf, HOST) if conf else None
    cordoned = None
    t_cordon = None
    rules = []
    if v2 and v2.get("verdict") in ("Failed", "Errored", "Timeout") and gpu_level(kind):
        rules = wait("the GPU's device taint", rules_on_last_gpu, 60, every=0.2) or []
        t_cordon = secs(t0)
    elif v2 and v2.get("verdict") in ("Failed", "Errored", "Timeout"):
        cordoned = wait("the cordon", lambda: node_facts(HOST)["unschedulable"], 60, every=0.2)
        t_cordon = secs(t0)
        wait("the node's condition True",
             lambda: (node_facts(HOST)["condition"] or {}).get("status") == "True", 20)
    facts = node_facts(HOST)
    events = node_events(HOST)
    m = metrics(HOST)
    if gpu_level(kind):
        # The GPU is out of service, the node is not: no cordon.
        ok = bool(rules) and not facts["unschedulable"]
        ev = [e for e in events if e["reason"] == "GpuQuarantined"]
        decided = (f"{numbers(v1)} ({(v1 or {}).get('finding') or '-'}); confirmation: {numbers(v2)}; "
                   f"GPU {LAST} tainted: DeviceTaintRule {', '.join(rules) or 'none'}, "
                   f"Event {ev[0]['reason'] if ev else 'none'}; node cordoned: {facts['unschedulable']}")
    else:
        ok = bool(cordoned) and (facts["condition"] or {}).get("status") == "True"
        ev = [e for e in events if e["reason"] == "Quarantined"]
        decided = (f"{numbers(v1)} ({(v1 or {}).get('finding') or '-'}); confirmation: {numbers(v2)}; "
                   f"cordoned: {facts['unschedulable']}, Event {ev[0]['reason'] if ev else 'none'}, "
                   f"condition {CONDITION}={(facts['condition'] or {}).get('status')}")
    took = (f"apply -> verdict {t_first} s, -> confirmation verdict {t_conf} s, -> cordon {t_cordon} s"
            + (f" ({round(t_cordon - t_conf, 1)} s after the confirmation verdict)" if t_cordon and t_conf else ""))
    row(doc, f"fault: {kind}", f"{what}, {RUN_NOW}", decided, took, ok,
        first=v1, confirmation=v2, node=facts, events=events, metrics=m,
        first_status=(first or {}).get("status"), confirmation_status=(conf or {}).get("status"))


def step_release(doc, kind):
    before = {r["metadata"]["name"] for r in runs_of(TEST_HOST)}
    t0 = time.time()
    set_fault(None)
    log(f"fault {kind} removed, {RUN_NOW} on {TEST_HOST}")
    run = wait("the run without the fault",
               lambda: next((r for r in new_runs(TEST_HOST, before) if finished(r)), None), 300)
    t_run = secs(t0)
    v = verdict_of(run, HOST) if run else None

    def released():
        f = node_facts(HOST)
        return (not f["unschedulable"] and not f["quarantine_record"] and not f["quarantine_label"]
                and (f["condition"] or {}).get("status") == "False")

    if gpu_level(kind):
        def released():
            return not rules_on_last_gpu() and not node_facts(HOST)["unschedulable"]
    rel = wait("the release", released, 60, every=0.2) if v and v.get("verdict") == "Passed" else None
    t_rel = secs(t0)
    facts = node_facts(HOST)
    if gpu_level(kind):
        events = [e for e in node_events(HOST) if e["reason"] == "GpuReleased"]
        decided = (f"{numbers(v)}; released: GPU {LAST}'s DeviceTaintRule "
                   f"{'deleted' if not rules_on_last_gpu() else 'still there'}, node cordoned: "
                   f"{facts['unschedulable']}, Event {events[0]['reason'] if events else 'none'}")
    else:
        events = [e for e in node_events(HOST) if e["reason"] == "Released"]
        decided = (f"{numbers(v)}; released: cordon {'undone' if not facts['unschedulable'] else 'still on'}, "
                   f"record {'removed' if not facts['quarantine_record'] else 'still there'}, "
                   f"condition {CONDITION}={(facts['condition'] or {}).get('status')}, "
                   f"Event {events[0]['reason'] if events else 'none'}")
    row(doc, f"release after {kind}", f"fault {kind} removed on the node's side, {RUN_NOW}", decided,
        f"apply -> verdict {t_run} s, -> released {t_rel} s", bool(rel),
        verdict=v, node=facts, events=events, metrics=metrics(HOST), run_status=(run or {}).get("status"))


TEST_PROBE = "e2e-probe"
PROBE_LABEL = "e2e.gpufabric.io/own-gpu"


def emulated_test(name, selector, suite, extra_env=()):
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "FabricTest",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": selector,
            "suite": suite,
            "quarantine": {"mode": "Cordon", "maxQuarantined": 1, "confirmRetest": True,
                           "failuresToQuarantine": 1, "passesToRelease": 1},
            "agent": {"timeoutSeconds": 300, "env": list(extra_env)},
        },
    }


def over_emulated(name, suite):
    """A test over every emulated node. With more of them than GPUs, the ranks of two nodes
    may share a GPU and measure anyway (the sockets between the namespaces, not the GPUs, set
    the bandwidth), and the node checks go one node a GPU at once."""
    shared = bool(GPUS) and len(EMULATED) > GPUS
    env = [{"name": "FABRIC_SHARED_GPUS", "value": "true"}] if shared else []
    t = emulated_test(name, {ROLE_LABEL: "emulated"}, suite, env)
    if shared:
        t["spec"]["rollout"] = {"maxUnavailable": GPUS}
    return t


# Sockets over veth carry about 1 GB/s: 64 MiB pairs, and a probe whose gradients (134 MB)
# take about as long as its GEMMs (bench/ddp-nodes-check.sh).
# E2E_PAIR_PARTNERS=1: the node-pair step with one partner a node (suite.nodePairs.partners).
PAIRS = {"enabled": True, "pairing": "ring", "bytes": 64 << 20,
         "partners": int(os.environ.get("E2E_PAIR_PARTNERS", "2"))}
PROBE_SHAPE = {"hidden": 2048, "layers": 8, "batchPerGpu": 131072}


def shape():
    if SIM:
        path = ENV["E2E_FLEET"]
        fleet = yaml.safe_load(open(path))
        for n in fleet["nodes"]:
            if n["name"] == SHAPED:
                n["faults"] = [{"kind": "slowNic", "factor": 0.25}]
        yaml.safe_dump(fleet, open(path, "w"))
        return "sim slowNic 0.25"
    cmd = ENV["E2E_SHAPE_CMD"]
    subprocess.run(cmd, shell=True, check=True)
    return cmd.split()[-1]


def run_marks(test, t0, marks, watch_node=None):
    """A predicate for wait(): records when the test's first run finished its node checks,
    its pairs, its probe and itself, and when watch_node was cordoned; true once every run
    of the test has finished (and a cordon had a few seconds to follow)."""

    def progress():
        rs = runs_of(test)
        main = next((r for r in rs if r["spec"]["trigger"] != "Confirmation"), None)
        if not main:
            return None
        st = main.get("status", {})
        prog = st.get("progress") or {}
        vs = {n["node"]: n.get("verdict") for n in st.get("nodes", [])}
        if "checks" not in marks and (
                (prog.get("total") and prog.get("done") == prog.get("total"))
                or (vs and all(v not in ("Pending", "Running") for v in vs.values())
                    and len(vs) == st.get("nodeCount"))):
            marks["checks"] = secs(t0)
        if "pairs" not in marks and (st.get("nodePairs") or {}).get("done"):
            marks["pairs"] = secs(t0)
        if "probe" not in marks and (st.get("ddpNodes") or {}).get("done"):
            marks["probe"] = secs(t0)
        if "sweep" not in marks and (st.get("ncclNodes") or {}).get("done"):
            marks["sweep"] = secs(t0)
        if "run" not in marks and finished(main):
            marks["run"] = secs(t0)
        if watch_node and "cordon" not in marks and node_facts(watch_node)["unschedulable"]:
            marks["cordon"] = secs(t0)
        active = get(ft_path(test)).get("status", {}).get("activeRun")
        if "run" in marks and not active and all(finished(r) for r in rs):
            # Settled: a few seconds more for a cordon that follows the verdict.
            marks.setdefault("_settled", time.time())
            return time.time() - marks["_settled"] > 5 or "cordon" in marks
        return None

    return progress


def took_of(marks):
    return "apply " + ", ".join(f"-> {k} {v} s" for k, v in marks.items() if not k.startswith("_"))


def main_run(test):
    return next((r for r in runs_of(test) if r["spec"]["trigger"] != "Confirmation"), {})


def node_checks(run):
    """The run's nodes, from its shards (every node) or its status."""
    shard_nodes = [n for sh in (shards_of(run["metadata"]["name"]) if run else [])
                   for n in sh.get("status", {}).get("nodes", [])]
    return shard_nodes or run.get("status", {}).get("nodes", [])


def step_pairs(doc):
    if len(EMULATED) < 3:
        row(doc, "node pairs", "-", "not run: fewer than 2 GPUs", "-", False)
        return
    rate = shape()
    log(f"{SHAPED}'s link shaped to {rate}")
    t0 = time.time()
    req("POST", ft_path(), over_emulated(TEST_NODES, {"nodePairs": PAIRS}))
    log(f"applied FabricTest {TEST_NODES} over {', '.join(EMULATED)}")
    marks = {}
    wait("the node-pair run", run_marks(TEST_NODES, t0, marks, SHAPED), 300, every=1.0)
    run = main_run(TEST_NODES)
    st = run.get("status", {})
    nodes = node_checks(run)
    checks = {n["node"]: n.get("verdict") for n in nodes}
    pairs = []
    for n in nodes:
        for p in n.get("pairs", []):
            if p.get("rank") == 0:
                pairs.append({"round": p.get("round"), "pair": f"{n['node']} <-> {p.get('partner')}",
                              "state": p.get("state"), "busbw": p.get("busbwGbps"),
                              "transport": p.get("transport"),
                              "retest": p.get("confirmation", False), "message": p.get("message")})
    pairs.sort(key=lambda p: (p["round"] or 0, p["pair"]))
    findings = st.get("findings", []) or []
    named = [f for f in findings if f.get("severity") == "Critical"
             and SHAPED in json.dumps(f.get("subject", {}))]
    others = [f for f in findings if f.get("severity") == "Critical" and f not in named]
    facts = node_facts(SHAPED)
    events = [e for e in node_events(SHAPED) if e["reason"] == "Quarantined"]
    np_ = st.get("nodePairs") or {}
    ok = bool(named) and not others and facts["unschedulable"]
    check_words = ", ".join(f"{k} {v}" for k, v in checks.items())
    decided = (f"node verdicts: {check_words}; {np_.get('measured', 0)} of {np_.get('pairs', 0)} pairs "
               f"measured in {np_.get('rounds', '?')} rounds ({np_.get('retested', 0)} retested); "
               f"named: {'; '.join(f.get('message', '') for f in named) or 'nobody'}"
               f"{'; also Critical: ' + '; '.join(f.get('message', '') for f in others) if others else ''}; "
               f"{SHAPED} cordoned: {facts['unschedulable']}, Event {events[0]['reason'] if events else 'none'}")
    row(doc, "node pairs",
        f"FabricTest {TEST_NODES} over {len(EMULATED)} emulated nodes: nodePairs ring 64 MiB, "
        f"{PAIRS['partners']} partner(s) a node; "
        f"{SHAPED}'s link at {rate}", decided, took_of(marks), ok,
        checks=checks, pairs=pairs, findings=findings, node=facts, events=events,
        metrics=metrics(SHAPED), run_status=st,
        confirmation=[r.get("status") for r in runs_of(TEST_NODES) if r["spec"]["trigger"] == "Confirmation"])


def step_probe(doc):
    probe_nodes = [n for n in EMULATED if n != SHAPED][:4]
    if GPUS:
        probe_nodes = probe_nodes[:min(GPUS, 4)]
    if len(probe_nodes) < 2:
        row(doc, "multi-node probe", "-", "not run: fewer than 2 GPUs", "-", False)
        return
    t0 = time.time()
    t = emulated_test(TEST_PROBE, {PROBE_LABEL: "true"},
                      {"ddpNodes": {"enabled": True, "maxNodes": len(probe_nodes)},
                       "ddpProbe": PROBE_SHAPE})
    req("POST", ft_path(), t)
    log(f"applied FabricTest {TEST_PROBE} over {', '.join(probe_nodes)}")
    marks = {}
    wait("the probe run", run_marks(TEST_PROBE, t0, marks), 300, every=1.0)
    run = main_run(TEST_PROBE)
    st = run.get("status", {})
    checks = {n["node"]: numbers(n) for n in node_checks(run)}
    probe = st.get("ddpNodes") or {}
    pts = "; ".join(f"{p.get('nodes')} node(s) step {p.get('stepMs', 0):.1f} ms, efficiency "
                    f"{100 * (p.get('scalingEfficiency') or 0):.0f}%" for p in probe.get("points", []))
    ok = probe.get("state") == "Measured" and len(probe.get("points", [])) >= 2
    check_words = ", ".join(f"{k} {v.split(',')[0]}" for k, v in checks.items())
    strag = "; ".join(f"straggler {s.get('node')} +{s.get('slowerPercent', 0):.1f}%"
                      for s in probe.get("stragglers", []))
    decided = (f"node checks: {check_words}; probe over {', '.join(probe.get('nodes', []) or [])}: "
               f"{probe.get('state', '-')}{' (' + probe['message'] + ')' if probe.get('message') else ''}"
               f": {pts or '-'}{'; ' + strag if strag else ''}")
    row(doc, "multi-node probe",
        f"FabricTest {TEST_PROBE} over {len(probe_nodes)} emulated nodes of one GPU each: ddpNodes, "
        f"probe {PROBE_SHAPE['layers']} x {PROBE_SHAPE['hidden']}, batch {PROBE_SHAPE['batchPerGpu']}",
        decided, took_of(marks), ok, checks=checks, probe=probe, run_status=st)


TEST_BLOCKS = "e2e-blocks"
BLOCK_LABEL = "e2e.gpufabric.io/block"
# The path between the two nodes of the middle block, slowed: emu-2 <-> emu-3 (as a leaf switch
# degraded between them; each is fine with every other node).
SLOW_BLOCK = "b"
SLOW_PATH = ("emu-2", "emu-3")


def slow_path():
    """Takes the shaped node's limit off (the pair step's) and slows only the path inside the
    middle block; returns the rate."""
    if SIM:
        path = ENV["E2E_FLEET"]
        fleet = yaml.safe_load(open(path))
        for n in fleet["nodes"]:
            if n["name"] == SHAPED:
                n.pop("faults", None)
            if n["name"] == SLOW_PATH[0]:
                n["faults"] = [{"kind": "badPath", "peer": SLOW_PATH[1], "factor": 0.1}]
        yaml.safe_dump(fleet, open(path, "w"))
        return "sim badPath 0.1"
    subprocess.run(ENV["E2E_UNSHAPE_CMD"], shell=True, check=True)
    cmd = ENV["E2E_SHAPE_PATH_CMD"]
    subprocess.run(cmd, shell=True, check=True)
    return cmd.split()[-1]


def sweep_curve(sweep, coll):
    """[(node count, busbw at the large sizes)] of `coll` in a multi-node sweep's status."""
    return [(p.get("nodes"), x["largeBusbw"]) for p in sweep.get("points", [])
            for x in p.get("summary", []) if x.get("collective") == coll
            and x.get("largeBusbw") is not None]


def step_blocks(doc):
    """The multi-node NCCL sweep over the emulated nodes in three topology blocks of two
    (label e2e.gpufabric.io/block a, b, c), the path inside block b slowed: each block's
    sweep, then one across the blocks; block b named slow on the run (a condition, no
    finding), no node failed or cordoned for it."""
    if len(EMULATED) != 6:
        row(doc, "topology blocks", "-", "not run: needs the six emulated nodes", "-", False)
        return
    rate = slow_path()
    log(f"{SHAPED}'s limit taken off; the path {SLOW_PATH[0]} <-> {SLOW_PATH[1]} at {rate}")
    t0 = time.time()
    sweep = {"enabled": True, "maxNodes": 8, "collectives": ["allReduce", "allGather"],
             "minBytes": 1 << 20, "maxBytes": 64 << 20, "largeBytes": 16 << 20,
             "topologyKey": BLOCK_LABEL}
    suite = {"ncclSweep": {"enabled": False}, "ddpProbe": {"enabled": False},
             "compute": {"gemm": {"enabled": False}, "memory": {"enabled": False},
                         "sdc": {"enabled": False}},
             "ncclNodes": sweep}
    req("POST", ft_path(), over_emulated(TEST_BLOCKS, suite))
    log(f"applied FabricTest {TEST_BLOCKS} over {', '.join(EMULATED)}")
    marks = {}
    wait("the topology-block run", run_marks(TEST_BLOCKS, t0, marks), 300, every=1.0)
    run = main_run(TEST_BLOCKS)
    st = run.get("status", {})
    checks = {n["node"]: n.get("verdict") for n in node_checks(run)}
    phase = st.get("ncclNodes") or {}

    def words(sw):
        return ", ".join(f"{n} nodes {bw:.2f}" for n, bw in sweep_curve(sw, "allReduce")) or "-"

    # A block's sweep and the one across blocks are flattened into their objects.
    blocks = [{"value": b.get("value"), "nodes": b.get("nodes"), "state": b.get("state"),
               "allReduce": sweep_curve(b, "allReduce"), "allGather": sweep_curve(b, "allGather"),
               "words": words(b)}
              for b in phase.get("blocks", [])]
    across = {k: v for k, v in phase.items() if k != "blocks"}
    slow = phase.get("slowBlocks", []) or []
    slow_named = sorted({b.get("value") for b in slow})
    cond = next((c for c in st.get("conditions", []) if c.get("type") == "NcclSlowBlock"), None)
    named_in_findings = [f for f in st.get("findings", []) or []
                         if f.get("severity") in ("Critical", "Warning")
                         and f"{BLOCK_LABEL}={SLOW_BLOCK}" in (f.get("message") or "")]
    held = {n: node_facts(n) for n in EMULATED}
    by_this = [n for n, f in held.items()
               if TEST_BLOCKS in (f["quarantine_record"] or "")
               or (f["unschedulable"] and n != SHAPED)]
    ok = (across.get("done") and len(blocks) == 3
          and all(b["state"] == "Measured" for b in blocks)
          and slow_named == [SLOW_BLOCK] and cond is not None and cond.get("status") == "True"
          and not named_in_findings and not by_this
          and all(v == "Passed" for v in checks.values()))
    block_words = "; ".join(f"{b['value']} ({', '.join(b['nodes'] or [])}): {b['state']}, all_reduce "
                            f"{b['words']} GB/s" for b in blocks)
    decided = (f"node checks: {', '.join(f'{k} {v}' for k, v in checks.items())}; blocks: {block_words}; "
               f"across ({', '.join(across.get('nodes', []) or [])}): {across.get('state', '-')}, "
               f"all_reduce {words(across)} GB/s; slow blocks: {', '.join(slow_named) or 'none'}"
               f"{' (' + cond.get('message', '') + ')' if cond else ''}; "
               f"nodes cordoned by this test: {', '.join(by_this) or 'none'}")
    row(doc, "topology blocks",
        f"FabricTest {TEST_BLOCKS} over {len(EMULATED)} emulated nodes in 3 blocks of 2 "
        f"({BLOCK_LABEL}): ncclNodes allReduce, allGather 1-64 MiB; the path "
        f"{SLOW_PATH[0]} <-> {SLOW_PATH[1]} (block {SLOW_BLOCK}) at {rate}", decided,
        took_of(marks), ok, checks=checks, blocks=blocks, across=across, slow_blocks=slow,
        condition=cond, nodes=held, run_status=st)


def own_gpus_pod(name, gpus):
    """A pod as a user's GPU job would be, under the namespace's restricted Pod Security:
    `gpus` GPUs through the device plugin, the agent image's quick node check."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"e2e.gpufabric.io/step": "own-gpus"}},
        "spec": {
            "nodeName": HOST, "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "agent", "image": AGENT_IMAGE, "imagePullPolicy": "IfNotPresent",
                "args": ["node-check", "--quick"],
                "env": [{"name": "NCCL_NVLS_ENABLE", "value": "0"}],
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                "securityContext": {"allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
            }],
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
        },
    }


def step_own_gpus(doc):
    """Two pods of half the host's GPUs each, at once: each must see exactly the GPUs it was
    allocated (no GPU of the other pod, none missing), and measure them."""
    t0 = time.time()
    half = max(GPUS // 2, 1)
    names = ["e2e-own-gpus-a", "e2e-own-gpus-b"]
    for n in names:
        req("POST", f"/api/v1/namespaces/{NS}/pods", own_gpus_pod(n, half))

    def done():
        phases = {n: get(f"/api/v1/namespaces/{NS}/pods/{n}")["status"].get("phase") for n in names}
        return phases if all(p in ("Succeeded", "Failed") for p in phases.values()) else None

    phases = wait("both pods ended", done, 240) or {}
    seen = {}
    for n in names:
        r = S.get(f"{API}/api/v1/namespaces/{NS}/pods/{n}/log", timeout=30, **TLS)
        lines = [l for l in r.text.splitlines() if l.startswith("{")]
        try:
            d = json.loads(lines[-1]) if lines else {}
        except ValueError:
            d = {}
        seen[n] = {"phase": phases.get(n),
                   "gpus": [(g.get("uuid"), g.get("pciBusId")) for g in d.get("gpus", [])],
                   "log_tail": r.text.splitlines()[-3:] if not lines else []}
    host = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.split()
    a, b = ({u for u, _ in seen[n]["gpus"]} for n in names)
    ok = (all(seen[n]["phase"] == "Succeeded" for n in names) and len(a) == half and len(b) == half
          and not a & b and (a | b) <= set(host))
    decided = "; ".join(f"{n}: {seen[n]['phase']}, GPUs " +
                        ", ".join(f"{(p or '?')} {(u or '?')[:12]}" for u, p in seen[n]["gpus"])
                        for n in names)
    decided += f"; disjoint: {not a & b}, all the host's: {(a | b) <= set(host)}"
    row(doc, "own GPUs", f"two pods at once, nvidia.com/gpu: {half} each, image {AGENT_IMAGE}",
        decided, f"{secs(t0)} s", ok, pods=seen, host_gpus=host)
    for n in names:
        req("DELETE", f"/api/v1/namespaces/{NS}/pods/{n}", ok=(200, 202, 404))


def step_table(doc):
    print()
    print("| # | step | applied | what the operator decided | took | ok |")
    print("| --- | --- | --- | --- | --- | --- |")
    for i, r in enumerate(doc["rows"], 1):
        cells = [str(i), r["step"], r["applied"], r["decided"], r["took"], "yes" if r["ok"] else "NO"]
        print("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    d = doc["details"].get("node pairs")
    if d:
        print()
        print("| round | pair | state | busbw GB/s | transport | message |")
        print("| --- | --- | --- | --- | --- | --- |")
        for p in d["pairs"]:
            bw = "-" if p["busbw"] is None else f"{p['busbw']:.2f}"
            rnd = f"{p['round']}{' (retest)' if p['retest'] else ''}"
            print(f"| {rnd} | {p['pair']} | {p['state']} | {bw} | {p.get('transport') or '-'} | {p['message'] or ''} |")
        for f in d.get("findings", []):
            if f.get("severity") in ("Critical", "Warning") or f.get("metric") == "nodePairBusBw":
                print(f"finding: {f.get('severity')} {f.get('kind')} {f.get('metric')}: {f.get('message')}")
    d = doc["details"].get("multi-node probe")
    if d:
        pts = d["probe"].get("points", [])
        if pts:
            print()
            print("| nodes | GPUs | step ms | efficiency | comm alone ms | exposed comm ms |")
            print("| --- | --- | --- | --- | --- | --- |")
            for p in pts:
                print(f"| {p.get('nodes')} | {p.get('gpus')} | {p.get('stepMs', 0):.2f} | "
                      f"{100 * (p.get('scalingEfficiency') or 0):.1f}% | {p.get('commAloneMs', 0):.2f} | "
                      f"{p.get('exposedCommMs', 0):.2f} |")
    d = doc["details"].get("topology blocks")
    if d:
        print()
        print("| sweep | nodes | state | all_reduce GB/s by node count | all_gather GB/s by node count |")
        print("| --- | --- | --- | --- | --- |")
        across = d["across"]
        sweeps = [(f"block {b['value']}", b["nodes"], b["state"], b["allReduce"], b["allGather"])
                  for b in d["blocks"]]
        sweeps.append(("across blocks", across.get("nodes"), across.get("state"),
                       sweep_curve(across, "allReduce"), sweep_curve(across, "allGather")))
        for name, nodes, state, ar, ag in sweeps:
            cells = [", ".join(f"{n}: {bw:.2f}" for n, bw in c) or "-" for c in (ar, ag)]
            print(f"| {name} | {', '.join(nodes or [])} | {state} | {cells[0]} | {cells[1]} |")
        for b in d.get("slow_blocks", []):
            print(f"slow block: {b.get('key')}={b.get('value')} {b.get('collective')}: {b.get('message')}")
        for k in across.get("knees", []) or []:
            print(f"knee across blocks: {k.get('message')}")


STEPS = {"setup": step_setup, "clean": step_clean, "fault": step_fault,
         "release": step_release, "pairs": step_pairs, "probe": step_probe,
         "blocks": step_blocks, "table": step_table, "own-gpus": step_own_gpus}


def main():
    doc = load()
    for s in sys.argv[1:]:
        # fault:KIND and release:KIND take the fault's name (FAULTS).
        name, _, kind = s.partition(":")
        if name not in STEPS or (name in ("fault", "release")) != bool(kind) or (kind and kind not in FAULTS):
            raise SystemExit(f"unknown step {s}; steps: {', '.join(STEPS)} (fault:KIND, release:KIND "
                             f"with KIND one of {', '.join(FAULTS)})")
        try:
            STEPS[name](doc, kind) if kind else STEPS[name](doc)
        except SystemExit:
            raise
        except Exception as e:  # a step that breaks is a row saying so, then the next step
            row(doc, s, "-", f"the step broke: {e}", "-", False)
            if s == "setup":
                raise SystemExit(1)
        doc = load()


if __name__ == "__main__":
    main()
