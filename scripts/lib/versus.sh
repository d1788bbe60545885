# shellcheck shell=bash
# Deckhand next to upstream's kubelet on one testbed, for scripts/bench-probes --versus,
# scripts/bench-lifecycle --runtime-return, scripts/bench-devices and scripts/bench-claims:
# start either kubelet on the testbed's containerd with its own root dir, cgroup root, ports
# and static pod directory (standalone, or a node of a test cluster: "Cluster mode" below),
# run a block of rounds of scripts/lib/versus.py against it, remove its pods and stop it.
# Blocks alternate between the two kubelets; the caller sources this file and calls vs_main.
#
# Expects: VS_TB (testbed dir, up), VS_WORK (a fresh work dir), VS_DECKHAND (the agent's
# binary), VS_KUBELET (upstream's kubelet binary), VS_NODE (node name). VS_CG_DECKHAND and
# VS_CG_UPSTREAM name the kubelets' cgroup roots (deckhand-versus, upstream-versus), for two
# runs at once.
#
# Per-figure hooks (optional; FIG is the figure's name with every character other than a
# letter, digit or _ made _, e.g. vs_before_device_start for device-start), each called with
# KIND TAG when the caller has defined it:
#   vs_prestart_FIG  before the kubelet starts (a non-zero return fails the block)
#   vs_before_FIG    the kubelet is up and healthy, before the rounds (a non-zero return fails
#                    the block); it may set the array VS_EXTRA_ARGS, passed on to versus.py
#   vs_after_FIG     after the rounds, also when they failed, before the kubelet is stopped
# and vs_cleanup_extra (no arguments), called by vs_cleanup on exit, also on failure.
#
# Cluster mode: a prestart hook that calls `vs_cluster_node KIND DIR` (or sets VS_CLUSTER, a
# test cluster's dir that is up, and VS_NODE, a node name with DIR/NAME.kubeconfig) makes the
# block's kubelet a node of that cluster (--kubeconfig); vs_block unsets VS_CLUSTER after it.

VS_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VS_PID=
VS_KIND=
VS_CG_DECKHAND=${VS_CG_DECKHAND:-deckhand-versus}
VS_CG_UPSTREAM=${VS_CG_UPSTREAM:-upstream-versus}
VS_EXTRA_ARGS=()
VS_CLUSTER=

vs_free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# vs_cgroup_root NAME: an empty cgroup NAME in every v1 hierarchy (or under the v2 root), as
# both kubelets want their --cgroup-root to exist.
vs_cgroup_root() {
    local c d
    if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
        mkdir -p "/sys/fs/cgroup/$1"
        return
    fi
    for c in /sys/fs/cgroup/*/; do
        c=${c%/}
        [[ -f $c/cgroup.procs && ! -L $c ]] || continue
        d=$c/$1
        mkdir -p "$d"
        if [[ -f $c/cpuset.cpus ]]; then
            cat "$c/cpuset.cpus" >"$d/cpuset.cpus"
            cat "$c/cpuset.mems" >"$d/cpuset.mems"
        fi
    done
}

# vs_cgroup_remove NAME: removes the cgroup tree NAME again (deepest first); what still has
# processes stays.
vs_cgroup_remove() {
    local c
    for c in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
        [[ -d ${c%/}/$1 ]] || continue
        find "${c%/}/$1" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
}

# vs_start deckhand|upstream TAG: starts the kubelet; sets VS_PODS_PORT, VS_HZ_PORT, VS_MANIFESTS.
vs_start() {
    local kind=$1 tag=$2 dir=$VS_WORK/$1-$2
    VS_KIND=$kind
    VS_PODS_PORT=$(vs_free_port)
    VS_HZ_PORT=$(vs_free_port)
    VS_MANIFESTS=$dir/manifests
    mkdir -p "$VS_MANIFESTS" "$dir/root" "$dir/logs"
    local endpoint="unix://$VS_TB/containerd.sock"
    local evict='memory.available<100Mi,nodefs.available<1%,nodefs.inodesFree<1%,imagefs.available<1%'
    local -a cluster=()
    if [[ -n $VS_CLUSTER ]]; then cluster=(--kubeconfig="$VS_CLUSTER/$VS_NODE.kubeconfig"); fi
    if [[ $kind == deckhand ]]; then
        vs_cgroup_root "$VS_CG_DECKHAND"
        "$VS_DECKHAND" --container-runtime-endpoint="$endpoint" --hostname-override="$VS_NODE" \
            --pod-manifest-path="$VS_MANIFESTS" --root-dir="$dir/root" --pod-logs-dir="$dir/logs" \
            --healthz-port="$VS_HZ_PORT" --read-only-port="$VS_PODS_PORT" --address=127.0.0.1 \
            --cgroup-root="/$VS_CG_DECKHAND" --v=2 --image-gc-high-threshold=100 \
            --eviction-hard="$evict" --enable-server=false "${cluster[@]+"${cluster[@]}"}" \
            >"$dir/kubelet.log" 2>&1 &
    else
        VS_UPSTREAM_RAN=1
        vs_cgroup_root "$VS_CG_UPSTREAM"
        cat >"$dir/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: $VS_MANIFESTS
containerRuntimeEndpoint: $endpoint
cgroupDriver: cgroupfs
cgroupRoot: /$VS_CG_UPSTREAM
failSwapOn: false
failCgroupV1: false
address: 127.0.0.1
port: $(vs_free_port)
readOnlyPort: $VS_PODS_PORT
healthzBindAddress: 127.0.0.1
healthzPort: $VS_HZ_PORT
podLogsDir: $dir/logs
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%}
EOF
        # --cert-dir: its self-signed serving certificate goes to /var/lib/kubelet/pki otherwise.
        "$VS_KUBELET" --config="$dir/config.yaml" --root-dir="$dir/root" --cert-dir="$dir/pki" \
            --hostname-override="$VS_NODE" --v=2 "${cluster[@]+"${cluster[@]}"}" \
            >"$dir/kubelet.log" 2>&1 &
    fi
    VS_PID=$!
    local i
    for ((i = 0; i < 300; i++)); do
        [[ $(curl -s "http://127.0.0.1:$VS_HZ_PORT/healthz" || true) == ok ]] && return 0
        kill -0 "$VS_PID" 2>/dev/null || break
        sleep 0.2
    done
    tail -20 "$dir/kubelet.log" >&2
    echo "versus: $kind did not become healthy; see $dir/kubelet.log" >&2
    return 1
}

# vs_stop: removes the kubelet's pods (every manifest), waits until its /pods is empty and
# the runtime holds no running container of ours, then stops the kubelet (SIGTERM).
vs_stop() {
    [[ -n $VS_PID ]] || return 0
    rm -f "$VS_MANIFESTS"/*.yaml
    local i n
    for ((i = 0; i < 300; i++)); do
        n=$(curl -s "http://127.0.0.1:$VS_PODS_PORT/pods" | jq '.items | length' 2>/dev/null || echo 1)
        [[ $n == 0 ]] && break
        sleep 0.2
    done
    # Upstream's kubelet stops the containers but leaves them (and their sandboxes) to its GC:
    # wait until no task of the pods runs any more.
    for ((i = 0; i < 150; i++)); do
        n=$(ctr --address "$VS_TB/containerd.sock" -n k8s.io tasks ls -q 2>/dev/null | wc -l)
        ((n == 0)) && break
        sleep 0.2
    done
    kill -TERM "$VS_PID" 2>/dev/null || true
    wait "$VS_PID" 2>/dev/null || true
    VS_PID=
    vs_unmount
}

# vs_unmount: upstream's kubelet bind-mounts its root dir onto itself (to make it shared);
# that mount outlives it.
vs_unmount() {
    local m
    for m in $(awk -v w="$VS_WORK/" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r); do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
}

# vs_hook POINT FIGURE KIND TAG: calls vs_POINT_FIG KIND TAG if the caller defined it (see
# the top); returns what it returns, 0 if there is none.
vs_hook() {
    local fn=vs_$1_${2//[!a-zA-Z0-9_]/_}
    declare -F "$fn" >/dev/null || return 0
    "$fn" "$3" "$4"
}

# vs_block KIND TAG FIGURE ROUNDS OUT: one kubelet, one block of rounds of FIGURE.
vs_block() {
    local kind=$1 tag=$2 figure=$3 rounds=$4 out=$5 rc=0
    VS_EXTRA_ARGS=()
    vs_hook prestart "$figure" "$kind" "$tag" || return 1
    vs_start "$kind" "$tag" || return 1
    if vs_hook before "$figure" "$kind" "$tag"; then
        python3 "$VS_HERE/versus.py" "$figure" --kubelet "$kind" --tag "$tag" \
            --pods-port "$VS_PODS_PORT" --healthz-port "$VS_HZ_PORT" --manifests "$VS_MANIFESTS" \
            --shared "$VS_WORK/shared" --testbed "$VS_TB" --testbed-cmd "$VS_HERE/../testbed" \
            --rounds "$rounds" --seed "${tag//[!0-9]/}" --out "$out" \
            "${VS_EXTRA_ARGS[@]+"${VS_EXTRA_ARGS[@]}"}" >&2 || rc=1
    else
        rc=1
    fi
    vs_hook after "$figure" "$kind" "$tag" || rc=1
    VS_EXTRA_ARGS=()
    vs_stop
    VS_CLUSTER=
    return "$rc"
}

# vs_run OUT ROUNDS BLOCKS FIGURE...: for each figure, BLOCKS blocks of ROUNDS rounds per
# kubelet, upstream and Deckhand alternating (upstream first in odd blocks, Deckhand first in
# even ones).
vs_run() {
    local out=$1 rounds=$2 blocks=$3
    shift 3
    mkdir -p "$VS_WORK/shared"
    local figure b order k
    for figure in "$@"; do
        for ((b = 1; b <= blocks; b++)); do
            if ((b % 2)); then order="upstream deckhand"; else order="deckhand upstream"; fi
            for k in $order; do
                echo "versus: $figure, block $b of $blocks, $k ($(uptime | sed 's/.*load average: //'))" >&2
                vs_block "$k" "b$b" "$figure" "$rounds" "$out" || return 1
            done
        done
    done
}

# vs_logs_clean: upstream's kubelet links each container's log into /var/log/containers
# whatever its podLogsDir, and leaves the links of its last pods when it stops: removes the
# links into VS_WORK, and the directory if it was not there before vs_main (VS_LOGDIR_MADE=1)
# and is empty now.
VS_LOGDIR_MADE=0
vs_logs_clean() {
    local l
    [[ -n ${VS_WORK:-} && -d /var/log/containers ]] || return 0
    for l in /var/log/containers/*.log; do
        if [[ -L $l && $(readlink "$l") == "$VS_WORK"/* ]]; then rm -f "$l"; fi
    done
    if ((VS_LOGDIR_MADE)); then rmdir /var/log/containers 2>/dev/null || true; fi
}

# vs_serving PATH: something accepts connections on the unix socket PATH.
vs_serving() {
    python3 -c 'import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError:
    sys.exit(1)' "$1"
}

# vs_mounted_anywhere PATH: PATH is a mount point in some process's mount namespace (a test's
# device plugin binds its own directory onto /var/lib/kubelet/device-plugins so).
vs_mounted_anywhere() {
    awk -v p="$1" '$5 == p { found = 1; exit } END { exit !found }' /proc/[0-9]*/mountinfo 2>/dev/null
}

# vs_host_clean: upstream's kubelet serves its device manager at
# /var/lib/kubelet/device-plugins/kubelet.sock whatever its --root-dir, and leaves the socket
# and its checkpoint there when it stops: removes them (with the sample device plugin's
# dp.<time> sockets, scripts/bench-devices) unless something serves the socket, and the
# directories vs_main found missing (VS_HOST_MADE) unless a mount namespace has them as a
# mount point.
VS_UPSTREAM_RAN=0
VS_HOST_MADE=()
vs_host_clean() {
    local dp=/var/lib/kubelet/device-plugins d
    if ((VS_UPSTREAM_RAN)) && [[ -d $dp ]] && ! vs_serving "$dp/kubelet.sock"; then
        rm -f "$dp/kubelet.sock" "$dp/kubelet_internal_checkpoint" "$dp"/dp.[0-9]*
    fi
    for d in "${VS_HOST_MADE[@]}"; do
        if [[ -d $d ]] && ! vs_mounted_anywhere "$d"; then rmdir "$d" 2>/dev/null || true; fi
    done
}

# vs_cluster_node KIND DIR: the block's kubelet joins the test cluster DIR (brought up first
# unless it is; then taken down by vs_cleanup) as the Node vs-KIND, deleted first so that
# each block registers it afresh.
VS_CLUSTER_OURS=
vs_cluster_node() {
    local kind=$1 dir=$2 kubectl
    if ! "$VS_HERE/../cluster" status "$dir" >/dev/null 2>&1; then
        VS_CLUSTER_OURS=$dir
        "$VS_HERE/../cluster" up "$dir" >&2 || return 1
    fi
    VS_NODE=vs-$kind
    "$VS_HERE/../cluster" node-kubeconfig "$dir" "$VS_NODE" >/dev/null || return 1
    # shellcheck disable=SC1091 # written by scripts/cluster up
    kubectl=$(. "$dir/cluster.env" && echo "$KUBECTL")
    "$kubectl" --kubeconfig="$dir/admin.kubeconfig" delete node "$VS_NODE" \
        --ignore-not-found --wait=true >&2 || return 1
    VS_CLUSTER=$dir
}

# vs_cleanup: the caller's vs_cleanup_extra if defined, stops a kubelet still running (on
# failure), removes what upstream's kubelet left outside its dirs and the cgroup roots.
vs_cleanup() {
    if declare -F vs_cleanup_extra >/dev/null; then vs_cleanup_extra || true; fi
    if [[ -n $VS_PID ]] && kill -0 "$VS_PID" 2>/dev/null; then
        kill -TERM "$VS_PID" 2>/dev/null || true
        wait "$VS_PID" 2>/dev/null || true
    fi
    VS_PID=
    vs_unmount
    vs_logs_clean
    vs_host_clean
    vs_cgroup_remove "$VS_CG_DECKHAND"
    vs_cgroup_remove "$VS_CG_UPSTREAM"
    if [[ -n $VS_CLUSTER_OURS ]]; then "$VS_HERE/../cluster" down "$VS_CLUSTER_OURS" >&2 || true; fi
}

# vs_exit: vs_cleanup, and the testbed down if vs_main brought it up (VS_TB_OURS=1).
VS_TB_OURS=0
vs_exit() {
    vs_cleanup
    if ((VS_TB_OURS)); then "$VS_HERE/../testbed" down "$VS_TB" >&2; fi
}

# vs_main NAME ROUNDS FIGURE...: the whole run for a bench script (as root): the agent (built
# unless BENCH_AGENT names one), upstream's kubelet (`scripts/cluster build-kubelet`), a testbed
# (BENCH_TESTBED, BENCH_BRIDGE, BENCH_SUBNET), BENCH_BLOCKS blocks (2) of ROUNDS rounds per
# kubelet and figure, the table; everything torn down again, also on failure (the testbed
# only if this run brought it up: one BENCH_TESTBED names that was up already stays).
vs_main() {
    local name=$1 rounds=$2
    shift 2
    local root
    root=$(cd "$VS_HERE/../.." && pwd)
    [[ $rounds =~ ^[0-9]+$ ]] && ((rounds >= 1)) || { echo "$name: ROUNDS must be a number >= 1" >&2; return 2; }
    ((EUID == 0)) || { echo "$name: containerd and CNI need root" >&2; return 1; }
    local blocks=${BENCH_BLOCKS:-2}
    VS_TB=${BENCH_TESTBED:-$root/.testbed/$name-versus}
    VS_WORK=$root/.testbed/$name-versus-run
    VS_NODE=versus-node
    if [[ -n ${BENCH_AGENT:-} ]]; then
        VS_DECKHAND=$BENCH_AGENT
    else
        (cd "$root" && cargo build --locked --release --bin deckhand >&2) || return 1
        VS_DECKHAND=${CARGO_TARGET_DIR:-$root/target}/release/deckhand
    fi
    VS_KUBELET=$("$root/scripts/cluster" build-kubelet) || return 1
    [[ -e /var/log/containers ]] || VS_LOGDIR_MADE=1
    local d
    for d in /var/lib/kubelet /var/lib/kubelet/device-plugins; do
        [[ -e $d ]] || VS_HOST_MADE=("$d" "${VS_HOST_MADE[@]}")
    done
    rm -rf "$VS_WORK"
    mkdir -p "$VS_WORK/bin"
    # Private copies: a rebuild during the run must not swap the binaries.
    cp -p "$VS_DECKHAND" "$VS_WORK/bin/deckhand"
    VS_DECKHAND=$VS_WORK/bin/deckhand
    VS_TB_OURS=1
    if "$VS_HERE/../testbed" status "$VS_TB" >/dev/null 2>&1; then VS_TB_OURS=0; fi
    trap vs_exit EXIT
    trap 'exit 130' INT TERM
    "$VS_HERE/../testbed" up "$VS_TB" --bridge "${BENCH_BRIDGE:-dhv0}" --subnet "${BENCH_SUBNET:-10.88.47.0/24}" >&2
    local out=$VS_WORK/rounds.jsonl
    echo "$name: load before: $(uptime | sed 's/.*load average: //')" >&2
    vs_run "$out" "$rounds" "$blocks" "$@" || return 1
    echo "$name: load after: $(uptime | sed 's/.*load average: //')" >&2
    python3 "$VS_HERE/versus.py" summary "$out"
    echo "rounds: $out; kubelet logs: $VS_WORK/*/kubelet.log" >&2
}
