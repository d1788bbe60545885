#!/usr/bin/env python3
"""Timing rounds for scripts/bench-probes --versus, scripts/bench-lifecycle --runtime-return and
scripts/bench-devices.

One kubelet (Deckhand or upstream's) runs on the testbed; this program drives rounds against
its read-only `/pods` and `/healthz` and appends one JSON object per round to OUT:

  readiness       the pod `ready-<tag>` (readiness: exec `test -f /w/ready`, period 1 s) is not
                  ready; the file is made at a fixed phase after a probe has run (below);
                  seconds until `/pods` shows the pod Ready. The probe's command also touches
                  /w/answered the first time it succeeds: its mtime is when the probe
                  answered, so the time from the answer to `/pods` (the kubelet's own part)
                  is measured too.
  liveness        a fresh pod per round (`live-<tag>-<n>`: liveness exec `test -f /w/alive`,
                  period 1 s, failureThreshold 2), running; the file is removed at the fixed
                  phase after a probe has run; seconds until `/pods` shows the container
                  running again with restartCount 1 (each pod is new, so no crash-loop
                  back-off applies).
  runtime-return  the pod `steady-<tag>` running; containerd is stopped (SIGTERM), 2 s
                  later started again (`scripts/testbed up`); from the moment its socket accepts
                  again, seconds until `/healthz` says ok and `/pods` shows the same container IDs
                  running; and the same from the moment `scripts/testbed up` returned (its
                  readiness check: the socket answers and the CRI plugin is loaded), 0 when
                  the kubelet was ok before. Neither kubelet fails `/healthz` for a runtime
                  outage (it is about the agent), so that figure is mostly the first poll.
                  Like for like, from the socket accepting until the kubelet's first
                  successful ListPodSandbox (its `/metrics`: kubelet_runtime_operations_total
                  minus _errors_total for list_podsandbox, polled by a thread of its own),
                  when either kubelet has reached the runtime again and listed what it holds.
  device-start    per round two fresh pods, one after the other (which first alternates by
                  round): `dev-<tag>-<n>` with one container asking for 1 device of
                  example.com/resource (limits: 1), and `plain-<tag>-<n>`, the same pod
                  without it, the floor; each from its manifest written until `/pods` shows
                  its container running, then the manifest removed, the pod gone from `/pods`
                  and no task left in containerd (upstream's `/pods` drops the pod before it
                  is stopped) before the next. The ratio device / plain of the same round (and
                  the difference) is the device's extra cost with the round's own load taken
                  out. With --plugin-log (the device plugin's log, upstream's sample plugin),
                  the `"Allocate"` lines it gained over each pod's life (created until gone)
                  are the Allocate calls for that pod. One unrecorded warm-up round runs first
                  (the kubelet's first pod pays for what later ones reuse).
  device-capacity the kubelet runs as a node of a test cluster (--cluster, --node) with
                  flip-device-plugin (--plugin-pid) serving two devices of --resource. Per
                  round, after a random wait of 0 to --period seconds (so that the change falls
                  at a random phase of the kubelets' 10 s node status period), the plugin is
                  told to mark one device unhealthy (SIGUSR1); seconds from then until a watch
                  of the Node sees its allocatable drop to 1 (capacity staying 2); then, after
                  another random wait, healthy again (SIGUSR2) until allocatable is 2. One
                  unrecorded warm-up pair runs first.
  pvc-start       the kubelet runs as a node of a test cluster (--cluster, --node). Per round two
                  pods from the API server, bound to the node (spec.nodeName) one after the
                  other (which first alternates by round): `claim-<tag>-<n>` mounting a
                  persistentVolumeClaim already Bound to a `local` PV (a directory under
                  --shared, node affinity for the node), and `plain-<tag>-<n>`, the same pod
                  without it (the floor); each from its POST until a watch of it sees the
                  container running; then while it runs, the mounts the kubelet holds for it
                  (mountinfo entries under a `pods/<uid>/` directory); then deleted (grace 1 s)
                  until the pod object is gone, and the claim and volume removed. One warm-up
                  pair runs first, not recorded.
  sts-ready       the kubelet runs as a node of a test cluster (--cluster, --node) where Rancher's
                  local-path-provisioner runs (StorageClass local-path). Once the Node is
                  Ready, per round a StatefulSet of --replicas replicas (Parallel, pinned to the
                  node, one claim each from a volumeClaimTemplate on local-path: the scheduler,
                  the provisioner and its helper pod on the node come first) from its POST
                  until its readyReplicas is --replicas (a watch); then the StatefulSet, its
                  pods and claims deleted and their volumes gone before the next round.
  summary         the table from the files the rounds wrote.

Phase: each probe command also touches /w/probed, so its mtime is when the kubelet last ran the
probe. The file is made (or removed) BENCH_PHASE seconds (0.3) after a probe was seen to run.
Where in the probe period the change falls otherwise decides most of the figure (anything from
0 to 1 s), and ten rounds of a random phase gave medians that differed by 0.3 s between two
kubelets that both probe every second; at a fixed phase the figure is the period's remainder
plus what the kubelet adds (its timer's accuracy, the verdict's way to `/pods`, for liveness the
kill and the restart). BENCH_PHASE=random restores the random wait.

Polls every 5 ms (one HTTP request each, on a kept-alive connection), so each figure is good to
about 5 ms. Standard library only.
"""

import argparse
import http.client
import json
import os
import random
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

POLL = 0.005


class Agent:
    """The kubelet's read-only port and healthz port on 127.0.0.1."""

    def __init__(self, pods_port, healthz_port):
        self.pods_port = pods_port
        self.healthz_port = healthz_port
        self.conns = {}

    def get(self, port, path):
        for attempt in range(2):
            conn = self.conns.get(port)
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                self.conns[port] = conn
            try:
                conn.request("GET", path)
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self.conns.pop(port, None)
                if attempt == 1:
                    return None, b""
        return None, b""

    def pods(self):
        code, body = self.get(self.pods_port, "/pods")
        if code != 200:
            return []
        try:
            return json.loads(body).get("items") or []
        except ValueError:
            return []

    def healthy(self):
        code, body = self.get(self.healthz_port, "/healthz")
        return code == 200 and body.strip() == b"ok"


def pod_named(pods, prefix):
    for p in pods:
        if (p.get("metadata") or {}).get("name", "").startswith(prefix):
            return p
    return None


def is_ready(pod):
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def container(pod, name):
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        if c.get("name") == name:
            return c
    return None


def wait(what, check, timeout, poll=POLL):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            sys.exit(f"versus: timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


def emit(out, record):
    with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)


def manifest_readiness(tag, image, hostdir):
    return f"""apiVersion: v1
kind: Pod
metadata:
  name: ready-{tag}
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - name: w
    hostPath: {{path: {hostdir}, type: Directory}}
  containers:
  - name: app
    image: {image}
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
    volumeMounts: [{{name: w, mountPath: /w}}]
    readinessProbe:
      exec:
        command: ["sh", "-c", "touch /w/probed; test -f /w/ready && {{ test -e /w/answered || touch /w/answered; }}"]
      periodSeconds: 1
      failureThreshold: 1
"""


def manifest_liveness(name, image, hostdir):
    return f"""apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - name: w
    hostPath: {{path: {hostdir}, type: Directory}}
  containers:
  - name: app
    image: {image}
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
    volumeMounts: [{{name: w, mountPath: /w}}]
    livenessProbe:
      exec:
        command: ["sh", "-c", "touch /w/probed; test -f /w/alive"]
      periodSeconds: 1
      failureThreshold: 2
"""


def put_manifest(manifests, name, text):
    tmp = os.path.join(manifests, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, os.path.join(manifests, f"{name}.yaml"))


def remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def phase_wait(hostdir, rng, timeout=30):
    """Waits for the next probe run (a fresh mtime of hostdir/probed), then until BENCH_PHASE
    seconds after it; with BENCH_PHASE=random, a random 1-2 s instead."""
    phase = os.environ.get("BENCH_PHASE", "0.3")
    if phase == "random":
        time.sleep(1.0 + rng.random())
        return
    probed = os.path.join(hostdir, "probed")

    def mtime():
        try:
            return os.stat(probed).st_mtime
        except FileNotFoundError:
            return 0.0

    seen = mtime()
    wait("a probe to run", lambda: mtime() > seen, timeout, 0.002)
    time.sleep(max(0.0, mtime() + float(phase) - time.time()))


def cmd_readiness(a, agent):
    hostdir = os.path.join(a.shared, f"ready-{a.tag}")
    os.makedirs(hostdir, exist_ok=True)
    ready, answered = os.path.join(hostdir, "ready"), os.path.join(hostdir, "answered")
    remove(ready)
    remove(answered)
    put_manifest(a.manifests, f"ready-{a.tag}", manifest_readiness(a.tag, a.image, hostdir))
    prefix = f"ready-{a.tag}"
    wait("the readiness pod to run", lambda: (lambda p: p and (container(p, "app") or {}).get("state", {}).get("running"))(pod_named(agent.pods(), prefix)), 180, 0.05)
    rng = random.Random(a.seed)
    for n in range(a.rounds):
        wait("the pod to be not ready", lambda: (lambda p: p and not is_ready(p))(pod_named(agent.pods(), prefix)), 30, 0.02)
        remove(answered)
        phase_wait(hostdir, rng)
        t_file = time.time()
        with open(ready, "w"):
            pass
        wait("the pod to be ready", lambda: (lambda p: p and is_ready(p))(pod_named(agent.pods(), prefix)), 30)
        t_ready = time.time()
        try:
            t_answer = os.stat(answered).st_mtime
        except FileNotFoundError:
            t_answer = None
        remove(ready)
        emit(a.out, {
            "figure": "readiness", "kubelet": a.kubelet, "block": a.tag, "round": n,
            "file_to_ready_s": round(t_ready - t_file, 4),
            "answer_to_ready_ms": None if t_answer is None else round((t_ready - t_answer) * 1000, 1),
        })
    remove(os.path.join(a.manifests, f"ready-{a.tag}.yaml"))


def cmd_liveness(a, agent):
    rng = random.Random(a.seed)
    for n in range(a.rounds):
        name = f"live-{a.tag}-{n}"
        hostdir = os.path.join(a.shared, name)
        os.makedirs(hostdir, exist_ok=True)
        alive = os.path.join(hostdir, "alive")
        with open(alive, "w"):
            pass
        put_manifest(a.manifests, name, manifest_liveness(name, a.image, hostdir))

        def running(restarts):
            p = pod_named(agent.pods(), name)
            c = p and container(p, "app")
            return bool(c and (c.get("state") or {}).get("running") and c.get("restartCount", 0) >= restarts)

        wait(f"pod {name} to run", lambda: running(0), 180, 0.05)
        # The liveness worker runs and has seen the file (two periods), then the phase.
        time.sleep(2.0)
        phase_wait(hostdir, rng)
        t_rm = time.time()
        remove(alive)
        wait(f"pod {name} restarted", lambda: running(1), 60)
        t_back = time.time()
        with open(alive, "w"):
            pass
        remove(os.path.join(a.manifests, f"{name}.yaml"))
        emit(a.out, {
            "figure": "liveness", "kubelet": a.kubelet, "block": a.tag, "round": n,
            "removed_to_restarted_s": round(t_back - t_rm, 4),
        })
        wait(f"pod {name} gone", lambda: pod_named(agent.pods(), name) is None, 60, 0.05)


def socket_accepts(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def running_ids(agent):
    ids = {}
    for p in agent.pods():
        for c in (p.get("status") or {}).get("containerStatuses") or []:
            if (c.get("state") or {}).get("running"):
                ids[(p["metadata"]["name"], c["name"])] = c.get("containerID")
    return ids


def manifest_steady(name, image, resources=""):
    """A pod that sleeps until TERM; `resources` is YAML put under its container."""
    return f"""apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {image}
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]{resources}
"""


def list_successes(agent):
    """Successful ListPodSandbox calls so far, from the kubelet's /metrics (None if unreadable)."""
    code, body = agent.get(agent.pods_port, "/metrics")
    if code != 200:
        return None
    total = errors = 0.0
    for line in body.decode(errors="replace").splitlines():
        if 'operation_type="list_podsandbox"' not in line:
            continue
        if line.startswith("kubelet_runtime_operations_total{"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith("kubelet_runtime_operations_errors_total{"):
            errors = float(line.rsplit(" ", 1)[1])
    return total - errors


class FirstList(threading.Thread):
    """Polls /metrics on connections of its own until a ListPodSandbox succeeds after `baseline`."""

    def __init__(self, agent, baseline):
        super().__init__(daemon=True)
        self.agent = Agent(agent.pods_port, agent.healthz_port)
        self.baseline = baseline
        self.at = None
        self.halt = False

    def run(self):
        # One scrape above the baseline is not yet a success: a scrape reads the errors counter
        # before the total (the names' order), and a call that fails between the two reads is
        # in the total only. Two scrapes in a row above it are; the first one's time counts.
        candidate = None
        while not self.halt:
            n = list_successes(self.agent)
            if n is not None and n > self.baseline:
                if candidate is not None:
                    self.at = candidate
                    return
                candidate = time.monotonic()
            else:
                candidate = None
            time.sleep(POLL)


def cmd_runtime_return(a, agent):
    sock = os.path.join(a.testbed, "containerd.sock")
    name = f"steady-{a.tag}"
    put_manifest(a.manifests, name, manifest_steady(name, a.image))
    wait(f"pod {name} to run", lambda: (lambda p: p and (container(p, "app") or {}).get("state", {}).get("running"))(pod_named(agent.pods(), name)), 180, 0.05)
    for n in range(a.rounds):
        before = wait("running containers", lambda: running_ids(agent), 60, 0.05)
        wait("healthz ok before the stop", agent.healthy, 60, 0.05)
        with open(os.path.join(a.testbed, "containerd.pid")) as f:
            pid = int(f.read().strip())
        os.kill(pid, signal.SIGTERM)
        wait("containerd to stop", lambda: not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(") ")[1][0] == "Z", 30, 0.01)
        wait("the socket to refuse", lambda: not socket_accepts(sock), 10, 0.01)
        time.sleep(0.1)
        # A /metrics that did not answer is no baseline (it would count every earlier call);
        # the lowest of three is, as one scrape can count a failing call as a success (above).
        baseline = min(
            wait("the kubelet's /metrics", lambda: (lambda n: n is not None and (n,))(list_successes(agent)), 10, 0.01)[0]
            for _ in range(3))
        first_list = FirstList(agent, baseline)
        first_list.start()
        time.sleep(1.9)
        up = subprocess.Popen([a.testbed_cmd, "up", a.testbed], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait("the socket to accept", lambda: socket_accepts(sock), 60, 0.001)
        t0 = time.monotonic()
        healthy_at = up_at = None
        deadline = t0 + 120
        while healthy_at is None or up_at is None:
            if up_at is None and up.poll() is not None:
                if up.returncode != 0:
                    sys.exit("versus: scripts/testbed up failed")
                up_at = time.monotonic()
            if healthy_at is None and agent.healthy() and running_ids(agent) == before:
                healthy_at = time.monotonic()
            if time.monotonic() > deadline:
                sys.exit("versus: timed out waiting for healthz ok with the same containers")
            time.sleep(POLL)
        first_list.join(max(0.0, deadline - time.monotonic()))
        first_list.halt = True
        listed = None if first_list.at is None else round(first_list.at - t0, 4)
        emit(a.out, {
            "figure": "runtime-return", "kubelet": a.kubelet, "block": a.tag, "round": n,
            "accepting_to_healthy_s": round(healthy_at - t0, 4),
            "ready_to_healthy_s": round(max(0.0, healthy_at - up_at), 4),
            "accepting_to_listed_s": listed,
        })


def manifest_device(name, image, count):
    limits = f"""
    resources:
      limits: {{example.com/resource: {count}}}""" if count else ""
    return manifest_steady(name, image, limits)


def allocate_lines(path):
    """How many Allocate calls the sample device plugin has logged (klog: `] "Allocate" ...`)."""
    if not path:
        return 0
    try:
        with open(path, errors="replace") as f:
            return sum(1 for line in f if '] "Allocate"' in line)
    except FileNotFoundError:
        return 0


def runtime_tasks(testbed):
    """The IDs of the tasks (running containers and sandboxes) in the testbed's k8s.io namespace."""
    out = subprocess.run(["ctr", "--address", os.path.join(testbed, "containerd.sock"), "-n", "k8s.io", "tasks", "ls", "-q"],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return ["?"]  # unreadable: not known to be quiet
    return out.stdout.split()


def cmd_device_start(a, agent):
    def one(name, count):
        before = allocate_lines(a.plugin_log)
        t0 = time.time()
        put_manifest(a.manifests, name, manifest_device(name, a.image, count))
        def running():
            p = pod_named(agent.pods(), f"{name}-")  # a static pod's name ends in -<node>
            status = (p or {}).get("status") or {}
            if status.get("phase") == "Failed":
                sys.exit(f"versus: pod {name} failed: {status.get('reason')}: {status.get('message')}")
            return p and ((container(p, "app") or {}).get("state") or {}).get("running")

        wait(f"pod {name} to run", running, 120)
        t_run = time.time()
        remove(os.path.join(a.manifests, f"{name}.yaml"))
        wait(f"pod {name} gone", lambda: pod_named(agent.pods(), f"{name}-") is None, 120, 0.02)
        # Upstream's /pods drops a static pod when its manifest goes, before the pod is
        # stopped: wait until containerd runs nothing, so the next pod's start does not
        # overlap this one's teardown.
        wait(f"pod {name}'s containers to stop", lambda: not runtime_tasks(a.testbed), 120, 0.02)
        return round(t_run - t0, 4), allocate_lines(a.plugin_log) - before

    one(f"warm-plain-{a.tag}", 0)
    one(f"warm-dev-{a.tag}", 1)
    for n in range(a.rounds):
        got = {}
        for kind in (("plain", "dev") if n % 2 == 0 else ("dev", "plain")):
            got[kind] = one(f"{kind}-{a.tag}-{n}", 1 if kind == "dev" else 0)
        emit(a.out, {
            "figure": "device-start", "kubelet": a.kubelet, "block": a.tag, "round": n,
            "device_s": got["dev"][0], "plain_s": got["plain"][0],
            "ratio": round(got["dev"][0] / got["plain"][0], 3) if got["plain"][0] > 0 else None,
            "extra_ms": round((got["dev"][0] - got["plain"][0]) * 1000, 1),
            "allocate_calls": got["dev"][1] if a.plugin_log else None,
            "allocate_calls_plain": got["plain"][1] if a.plugin_log else None,
            "first": "plain" if n % 2 == 0 else "device",
        })


class ApiServer:
    """The test cluster's API server as its admin (scripts/cluster's cluster.env and pki/)."""

    def __init__(self, cluster):
        url = None
        with open(os.path.join(cluster, "cluster.env")) as f:
            for line in f:
                if line.startswith("APISERVER_URL="):
                    url = line.split("=", 1)[1].strip().strip("'\"")
        if not url:
            sys.exit(f"versus: no APISERVER_URL in {cluster}/cluster.env")
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname, parsed.port or 443
        pki = os.path.join(cluster, "pki")
        self.context = ssl.create_default_context(cafile=os.path.join(pki, "ca.crt"))
        self.context.load_cert_chain(os.path.join(pki, "admin.crt"), os.path.join(pki, "admin.key"))

    def connect(self, timeout):
        return http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=timeout)

    def get(self, path):
        code, obj = self.request("GET", path)
        return obj if code == 200 else None

    def request(self, method, path, body=None):
        """(HTTP status, decoded body); (None, None) when the request could not be made."""
        conn = self.connect(10)
        try:
            data = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if data else {}
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            try:
                return resp.status, json.loads(raw) if raw else None
            except ValueError:
                return resp.status, None
        except (OSError, http.client.HTTPException):
            return None, None
        finally:
            conn.close()

    def must(self, method, path, body=None, ok=(200, 201, 202)):
        code, obj = self.request(method, path, body)
        if code not in ok:
            sys.exit(f"versus: {method} {path}: HTTP {code}: {str(obj)[:300]}")
        return obj

    def watch(self, path, deadline):
        """Yields each watch event's object until the stream ends or `deadline` passes."""
        conn = self.connect(max(1.0, deadline - time.time()))
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            if resp.status != 200:
                sys.exit(f"versus: watch {path}: HTTP {resp.status}: {resp.read()[:300]!r}")
            while time.time() < deadline:
                line = resp.readline()
                if not line:
                    return
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    sys.exit(f"versus: watch {path}: {event.get('object')}")
                yield event.get("object") or {}
        finally:
            conn.close()


def cmd_device_capacity(a, agent):
    api = ApiServer(a.cluster)
    rng = random.Random(a.seed)

    def amounts(node):
        status = (node or {}).get("status") or {}
        return ((status.get("capacity") or {}).get(a.resource), (status.get("allocatable") or {}).get(a.resource))

    def until(want, sig):
        node = api.get(f"/api/v1/nodes/{a.node}")
        if node is None:
            sys.exit(f"versus: cannot read Node {a.node}")
        if sig is None and amounts(node)[1] == want:
            return 0.0, amounts(node)[0]
        rv = node["metadata"]["resourceVersion"]
        path = (f"/api/v1/nodes?watch=true&resourceVersion={rv}"
                f"&fieldSelector={urllib.parse.quote('metadata.name=' + a.node)}")
        deadline = time.time() + 60
        t0 = time.time()
        if sig is not None:
            os.kill(a.plugin_pid, sig)
        while time.time() < deadline:
            for obj in api.watch(path, deadline):
                if amounts(obj)[1] == want:
                    return round(time.time() - t0, 4), amounts(obj)[0]
                path = (f"/api/v1/nodes?watch=true&resourceVersion={obj['metadata']['resourceVersion']}"
                        f"&fieldSelector={urllib.parse.quote('metadata.name=' + a.node)}")
        sys.exit(f"versus: Node {a.node}: allocatable {a.resource} not {want} within 60 s "
                 f"(capacity, allocatable: {amounts(api.get(f'/api/v1/nodes/{a.node}'))})")

    until("2", None)
    for n in range(-1, a.rounds):
        time.sleep(rng.uniform(0, a.period))
        down, capacity = until("1", signal.SIGUSR1)
        time.sleep(rng.uniform(0, a.period))
        up, _ = until("2", signal.SIGUSR2)
        if n < 0:
            continue  # the warm-up pair
        emit(a.out, {
            "figure": "device-capacity", "kubelet": a.kubelet, "block": a.tag, "round": n,
            "unhealthy_s": down, "healthy_s": up, "capacity_while_unhealthy": capacity,
        })


PVC_NS = "vs-claims"


def claim_objects(a, name, hostdir):
    """A local PV on `hostdir` for the node, and a claim pre-bound to it."""
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{PVC_NS}-{name}"},
          "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                   "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                   "claimRef": {"namespace": PVC_NS, "name": name},
                   "local": {"path": hostdir},
                   "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                       {"key": "kubernetes.io/hostname", "operator": "In", "values": [a.node]}]}]}}}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
           "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                    "volumeName": f"{PVC_NS}-{name}", "resources": {"requests": {"storage": "1Gi"}}}}
    return pv, pvc


def ensure_namespace(api):
    """The benches' namespace, with its default service account (pods are refused before)."""
    code, _ = api.request("POST", "/api/v1/namespaces", {"metadata": {"name": PVC_NS}})
    if code not in (201, 409):
        sys.exit(f"versus: cannot make namespace {PVC_NS}: HTTP {code}")
    sa = f"/api/v1/namespaces/{PVC_NS}/serviceaccounts/default"
    wait(f"the service account {PVC_NS}/default", lambda: api.get(sa) is not None, 60, 0.1)


def api_pod(a, name, claim):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"nodeName": a.node, "terminationGracePeriodSeconds": 1,
                    "automountServiceAccountToken": False, "enableServiceLinks": False,
                    "containers": [{"name": "app", "image": a.image, "imagePullPolicy": "IfNotPresent",
                                    "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]}]}}
    if claim:
        pod["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
        pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    return pod


def pod_mounts(uid):
    """The mount points under a `pods/<uid>/` directory, in this mount namespace."""
    with open("/proc/self/mountinfo") as f:
        return sum(1 for line in f if f"/pods/{uid}/" in line.split()[4])


def watch_until(api, path, check, what, timeout=120):
    """Follows a watch of `path` (a list path with a field selector) until `check(obj)`."""
    deadline = time.time() + timeout
    first = api.get(path)
    if first is None:
        sys.exit(f"versus: cannot list {path}")
    for obj in first.get("items") or []:
        if check(obj):
            return obj
    rv = first["metadata"]["resourceVersion"]
    while time.time() < deadline:
        sep = "&" if "?" in path else "?"
        for obj in api.watch(f"{path}{sep}watch=true&resourceVersion={rv}", deadline):
            rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
            if check(obj):
                return obj
    sys.exit(f"versus: {what} not within {timeout} s")


def cmd_pvc_start(a, agent):
    api = ApiServer(a.cluster)
    ensure_namespace(api)
    pods = f"/api/v1/namespaces/{PVC_NS}/pods"
    claims = f"/api/v1/namespaces/{PVC_NS}/persistentvolumeclaims"

    def selector(name):
        return f"{pods}?fieldSelector={urllib.parse.quote('metadata.name=' + name)}"

    def running(obj):
        for c in (obj.get("status") or {}).get("containerStatuses") or []:
            if c.get("name") == "app" and (c.get("state") or {}).get("running"):
                return True
        if (obj.get("status") or {}).get("phase") == "Failed":
            sys.exit(f"versus: pod {obj['metadata']['name']} failed: {obj.get('status')}")
        return False

    def one(name, with_claim):
        if with_claim:
            hostdir = os.path.join(a.shared, name)
            os.makedirs(hostdir, exist_ok=True)
            pv, pvc = claim_objects(a, name, hostdir)
            api.must("POST", "/api/v1/persistentvolumes", pv)
            api.must("POST", claims, pvc)
            watch_until(api, f"{claims}?fieldSelector={urllib.parse.quote('metadata.name=' + name)}",
                        lambda o: (o.get("status") or {}).get("phase") == "Bound", f"claim {name} bound")
        t0 = time.time()
        created = api.must("POST", pods, api_pod(a, name, name if with_claim else None))
        watch_until(api, selector(name), running, f"pod {name} running")
        took = time.time() - t0
        mounts = pod_mounts(created["metadata"]["uid"])
        api.must("DELETE", f"{pods}/{name}")
        gone = lambda: api.request("GET", f"{pods}/{name}")[0] == 404
        wait(f"pod {name} gone", gone, 120, 0.05)
        if with_claim:
            api.must("DELETE", f"{claims}/{name}")
            api.must("DELETE", f"/api/v1/persistentvolumes/{PVC_NS}-{name}")
        return round(took, 4), mounts

    one(f"warm-plain-{a.tag}", False)
    one(f"warm-claim-{a.tag}", True)
    for n in range(a.rounds):
        got = {}
        for kind in (("plain", "claim") if n % 2 == 0 else ("claim", "plain")):
            got[kind] = one(f"{kind}-{a.tag}-{n}", kind == "claim")
        emit(a.out, {
            "figure": "pvc-start", "kubelet": a.kubelet, "block": a.tag, "round": n,
            "claim_s": got["claim"][0], "plain_s": got["plain"][0],
            "ratio": round(got["claim"][0] / got["plain"][0], 3) if got["plain"][0] > 0 else None,
            "claim_mounts": got["claim"][1], "plain_mounts": got["plain"][1],
            "first": "plain" if n % 2 == 0 else "claim",
        })


def statefulset(a, name):
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name},
            "spec": {"replicas": a.replicas, "serviceName": name, "podManagementPolicy": "Parallel",
                     "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "nodeSelector": {"kubernetes.io/hostname": a.node},
                         "automountServiceAccountToken": False, "enableServiceLinks": False,
                         "terminationGracePeriodSeconds": 1,
                         "containers": [{"name": "app", "image": a.image, "imagePullPolicy": "IfNotPresent",
                                         "command": ["sh", "-c", "hostname >> /data/boots; trap 'exit 0' TERM; sleep 3600 & wait"],
                                         "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}},
                     "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                         "accessModes": ["ReadWriteOnce"], "storageClassName": "local-path",
                         "resources": {"requests": {"storage": "1Mi"}}}}]}}


def cmd_sts_ready(a, agent):
    api = ApiServer(a.cluster)
    ensure_namespace(api)

    def node_ready(obj):
        return any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in (obj.get("status") or {}).get("conditions") or [])

    nodes = f"/api/v1/nodes?fieldSelector={urllib.parse.quote('metadata.name=' + a.node)}"
    watch_until(api, nodes, node_ready, f"Node {a.node} Ready", 120)
    sets = f"/apis/apps/v1/namespaces/{PVC_NS}/statefulsets"
    claims = f"/api/v1/namespaces/{PVC_NS}/persistentvolumeclaims"
    pods = f"/api/v1/namespaces/{PVC_NS}/pods"
    for n in range(a.rounds):
        name = f"db-{a.tag}-{n}"
        ready = lambda o: ((o.get("status") or {}).get("readyReplicas") or 0) >= a.replicas
        t0 = time.time()
        api.must("POST", sets, statefulset(a, name))
        watch_until(api, f"{sets}?fieldSelector={urllib.parse.quote('metadata.name=' + name)}", ready,
                    f"StatefulSet {name} all {a.replicas} Ready", 600)
        took = time.time() - t0
        selector = urllib.parse.quote(f"app={name}")
        api.must("DELETE", f"{sets}/{name}")
        api.must("DELETE", f"{pods}?labelSelector={selector}")
        empty = lambda path: not (api.get(path) or {"items": [1]}).get("items")
        wait(f"pods of {name} gone", lambda: empty(f"{pods}?labelSelector={selector}"), 180, 0.2)
        api.must("DELETE", f"{claims}?labelSelector={selector}")
        wait(f"claims of {name} gone", lambda: empty(f"{claims}?labelSelector={selector}"), 180, 0.2)
        left = lambda: not any((pv.get("spec") or {}).get("storageClassName") == "local-path"
                               for pv in (api.get("/api/v1/persistentvolumes") or {"items": [{}]}).get("items") or [])
        wait(f"volumes of {name} removed by the provisioner", left, 300, 0.5)
        emit(a.out, {"figure": "sts-ready", "kubelet": a.kubelet, "block": a.tag, "round": n,
                     "replicas": a.replicas, "ready_s": round(took, 3)})


FIGURES = [
    ("readiness", "file_to_ready_s", "exec readiness probe (period 1 s): the file appears -> pod Ready in /pods", "s"),
    ("readiness", "answer_to_ready_ms", "  of which: the probe's answer -> Ready in /pods", "ms"),
    ("liveness", "removed_to_restarted_s", "exec liveness probe (period 1 s, failureThreshold 2): the file removed -> container restarted", "s"),
    ("runtime-return", "accepting_to_healthy_s", "containerd stopped 2 s, started again: its socket accepts -> /healthz ok with the same containers", "s"),
    ("runtime-return", "accepting_to_listed_s", "  like for like: its socket accepts -> the kubelet's first successful ListPodSandbox (/metrics)", "s"),
    ("runtime-return", "ready_to_healthy_s", "  the same from containerd ready (`scripts/testbed up` returned: CRI plugin loaded; 0 when already ok)", "s"),
    ("device-start", "device_s", "a static pod with 1 device of example.com/resource: manifest written -> container running in /pods", "s"),
    ("device-start", "plain_s", "  the same pod without the device, in the same round (the floor)", "s"),
    ("device-start", "cri_floor_s", "  one pod by raw CRI calls (RunPodSandbox, CreateContainer, StartContainer), before this kubelet's blocks (the raw-CRI floor)", "s"),
    ("device-start", "ratio", "  device / plain, per round", "x"),
    ("device-start", "extra_ms", "  device - plain, per round", "ms"),
    ("device-start", "allocate_calls", "  Allocate calls per device pod (1 container; the plugin's log)", "calls"),
    ("device-start", "allocate_calls_plain", "  Allocate calls per plain pod", "calls"),
    ("device-capacity", "unhealthy_s", "a device plugin marks 1 of 2 devices unhealthy -> the Node's allocatable shows 1 (API server watch)", "s"),
    ("device-capacity", "healthy_s", "  healthy again -> allocatable 2", "s"),
    ("pvc-start", "claim_s", "an API pod on a claim Bound to a local PV: POST -> container running (API server watch)", "s"),
    ("pvc-start", "plain_s", "  the same pod without the claim, same round (the floor)", "s"),
    ("pvc-start", "ratio", "  claim / plain, per round", "x"),
    ("pvc-start", "claim_mounts", "  mounts held for the claim pod while it runs (mountinfo under pods/<uid>/)", "mounts"),
    ("pvc-start", "plain_mounts", "  mounts held for the plain pod", "mounts"),
    ("sts-ready", "ready_s", "a StatefulSet with one local-path claim per replica: POST -> all replicas Ready (--replicas; the provisioner's helper pods included)", "s"),
]

FORMATS = {"ms": "{:.0f}", "x": "{:.2f}", "calls": "{:g}", "mounts": "{:g}"}


def cmd_summary(a):
    rows = []
    for path in a.files:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    out = ["| | upstream | Deckhand |", "| --- | --- | --- |"]
    for figure, key, label, unit in FIGURES:
        cells = []
        for kubelet in ("upstream", "deckhand"):
            vals = [r[key] for r in rows if r["figure"] == figure and r["kubelet"] == kubelet and r.get(key) is not None]
            if not vals:
                cells.append("-")
                continue
            fmt = FORMATS.get(unit, "{:.3f}").format
            sep = " to " if min(vals) < 0 else "-"
            cells.append(f"{fmt(statistics.median(vals))} {unit} ({fmt(min(vals))}{sep}{fmt(max(vals))}, n={len(vals)})")
        if any(c != "-" for c in cells):
            out.append(f"| {label} | {cells[0]} | {cells[1]} |")
    ratios = []
    for kubelet in ("upstream", "deckhand"):
        def median_of(key):
            vals = [r[key] for r in rows if r["figure"] == "device-start" and r["kubelet"] == kubelet and r.get(key) is not None]
            return statistics.median(vals) if vals else None
        device, floor = median_of("device_s"), median_of("cri_floor_s")
        ratios.append(f"{device / floor:.2f} x" if device and floor else "-")
    if any(r != "-" for r in ratios):
        out.append(f"| device pod / raw-CRI floor (medians) | {ratios[0]} | {ratios[1]} |")
    print("\n".join(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("readiness", "liveness", "runtime-return", "device-start", "device-capacity", "pvc-start",
                 "sts-ready"):
        p = sub.add_parser(name)
        p.add_argument("--kubelet", required=True, choices=["deckhand", "upstream"])
        p.add_argument("--pods-port", type=int, required=True)
        p.add_argument("--healthz-port", type=int, required=True)
        p.add_argument("--manifests")
        p.add_argument("--shared", help="a host directory the pods mount (hostPath)")
        p.add_argument("--image", default="localhost/deckhand/busybox:1.35")
        p.add_argument("--testbed", help="the testbed's directory (runtime-return)")
        p.add_argument("--testbed-cmd", help="scripts/testbed (runtime-return)")
        p.add_argument("--rounds", type=int, default=5)
        p.add_argument("--tag", required=True, help="names this block's pods")
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--out", required=True)
        p.add_argument("--plugin-log", help="the device plugin's log, for its Allocate calls (device-start)")
        p.add_argument("--cluster", help="the test cluster's dir (device-capacity, pvc-start)")
        p.add_argument("--node", help="the kubelet's Node (device-capacity, pvc-start)")
        p.add_argument("--plugin-pid", type=int, help="flip-device-plugin's PID (device-capacity)")
        p.add_argument("--resource", default="example.com/flip", help="its resource (device-capacity)")
        p.add_argument("--replicas", type=int, default=20, help="the StatefulSet's replicas (sts-ready)")
        p.add_argument("--period", type=float, default=10.0,
                       help="random wait before each change, up to this many seconds (device-capacity)")
    s = sub.add_parser("summary")
    s.add_argument("files", nargs="+")
    a = ap.parse_args()
    if a.cmd == "summary":
        return cmd_summary(a)
    agent = Agent(a.pods_port, a.healthz_port)
    {"readiness": cmd_readiness, "liveness": cmd_liveness, "runtime-return": cmd_runtime_return,
     "device-start": cmd_device_start, "device-capacity": cmd_device_capacity,
     "pvc-start": cmd_pvc_start, "sts-ready": cmd_sts_ready}[a.cmd](a, agent)


if __name__ == "__main__":
    main()
