# shellcheck shell=bash
# Helpers shared by scripts/testbed: messages, the testbed's paths and record file, and
# process lookups that do not trust `kill -0` (a killed containerd can stay a zombie when
# PID 1 does not reap, which is the case on the project's VMs).

log() { printf 'testbed: %s\n' "$*" >&2; }
warn() { printf 'testbed: warning: %s\n' "$*" >&2; }
die() {
    printf 'testbed: error: %s\n' "$*" >&2
    exit 1
}

# tb_paths DIR: set every TB_* path for the testbed rooted at DIR (made absolute).
# Everything containerd writes lives under DIR, except what containerd 1.6 hard-codes:
# /var/run/netns (CNI netns pins), /run/containerd/s (shim sockets), /var/lib/cni/results.
# shellcheck disable=SC2034 # the TB_* variables are used by the files that source this one
tb_paths() {
    [[ -n ${1:-} ]] || die "missing DIR argument"
    TB_DIR=$(realpath -m -- "$1")
    [[ $TB_DIR != / ]] || die "refusing to use / as the testbed directory"
    # The path is written into TOML and JSON unescaped.
    [[ $TB_DIR != *[\"\\[:cntrl:]]* ]] || die "DIR must not contain quotes, backslashes or control characters"
    TB_SOCK=$TB_DIR/containerd.sock
    TB_TTRPC=$TB_DIR/containerd.sock.ttrpc
    TB_CONFIG=$TB_DIR/config.toml
    TB_PIDFILE=$TB_DIR/containerd.pid
    TB_LOG=$TB_DIR/containerd.log
    TB_ROOT=$TB_DIR/root
    TB_STATE=$TB_DIR/state
    TB_RUNC=$TB_DIR/runc
    TB_OPT=$TB_DIR/opt
    TB_CNI=$TB_DIR/cni
    TB_NETD=$TB_DIR/cni/net.d
    # containerd's registry host directory (hosts.toml per registry host); tests that run a
    # registry write its entry here, containerd reads it at each pull.
    TB_CERTS_D=$TB_DIR/certs.d
    TB_IPAM=$TB_DIR/cni/ipam
    # CDI spec files (containerd 2.x reads only these, not the machine's /etc/cdi or
    # /var/run/cdi): tests and DRA drivers write their specs here.
    TB_CDI=$TB_DIR/cdi
    TB_ENV=$TB_DIR/testbed.env
    TB_NETNS_BEFORE=$TB_DIR/netns.before
    TB_OWNED=$TB_DIR/owned
    TB_CRI_SANDBOXES=$TB_ROOT/io.containerd.grpc.v1.cri/sandboxes
    TB_LOCK=$TB_DIR/.lock
    # Unix socket paths are limited to 107 bytes; fail here rather than in containerd.
    ((${#TB_TTRPC} < 100)) || die "DIR is too long for a unix socket path: $TB_TTRPC"
}

# tb_state_entries: what up creates in DIR and down removes (testbed.env and owned stay,
# so that leftovers and a second down still know the bridge, netns and sandbox ids).
tb_state_entries() {
    printf '%s\n' "$TB_CONFIG" "$TB_SOCK" "$TB_TTRPC" "$TB_PIDFILE" "$TB_LOG" "$TB_ROOT" \
        "$TB_STATE" "$TB_RUNC" "$TB_OPT" "$TB_CNI" "$TB_CERTS_D" "$TB_CDI" "$TB_NETNS_BEFORE" "$TB_LOCK"
}

# tb_lock: serialise up/down on one DIR (fd 9). The fd must not leak into containerd,
# or the lock would be held for its whole life: start_containerd closes it.
tb_lock() {
    mkdir -p "$TB_DIR"
    exec 9>>"$TB_LOCK"
    flock -w 120 9 || die "timed out waiting for the lock on $TB_LOCK (another up/down running?)"
}

# env_write: record bridge/subnet/network name and the runtime (2 or 1.6, and the dirs of its
# programs, empty for the packaged 1.6) in DIR/testbed.env (KEY=VALUE lines); CDI_DIR is the
# CDI spec directory containerd reads (empty on 1.6, which has no CDI).
env_write() {
    local cdi=""
    [[ ${RUNTIME:-1.6} == 1.6 ]] || cdi=$TB_CDI
    printf 'BRIDGE=%s\nSUBNET=%s\nNETNAME=%s\nSOCKET=%s\nRUNTIME=%s\nRUNTIME_PATH=%s\nCDI_DIR=%s\n' \
        "$BRIDGE" "$SUBNET" "$NETNAME" "$TB_SOCK" "${RUNTIME:-1.6}" "${RUNTIME_PATH:-}" "$cdi" >"$TB_ENV.tmp"
    mv "$TB_ENV.tmp" "$TB_ENV"
}

# env_read: load DIR/testbed.env into BRIDGE/SUBNET/NETNAME without sourcing it.
# Returns 1 when there is no record (a DIR never brought up).
env_read() {
    local key value
    [[ -f $TB_ENV ]] || return 1
    while IFS='=' read -r key value; do
        case $key in
            BRIDGE) BRIDGE=$value ;;
            SUBNET) SUBNET=$value ;;
            NETNAME) NETNAME=$value ;;
            RUNTIME) RUNTIME=$value ;;
            RUNTIME_PATH) RUNTIME_PATH=$value ;;
        esac
    done <"$TB_ENV"
    [[ -n ${BRIDGE:-} && -n ${SUBNET:-} && -n ${NETNAME:-} ]]
}

# proc_alive PID: the process exists and is not a zombie (state field of /proc/PID/stat;
# the command name before it may hold spaces or parentheses, so cut at the last ") ").
proc_alive() {
    local pid=$1 stat rest
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    { read -r stat <"/proc/$pid/stat"; } 2>/dev/null || return 1
    rest=${stat##*) }
    [[ ${rest%% *} != Z ]]
}

# proc_argv_has PID A B: PID's argv holds A immediately followed by B (exact words, so
# /tmp/tb never matches /tmp/tb2). Reads /proc with builtins only: no fork per process.
proc_argv_has() {
    local pid=$1 a=$2 b=$3 i
    local -a argv=()
    { mapfile -d '' -t argv <"/proc/$pid/cmdline"; } 2>/dev/null || return 1
    for ((i = 0; i + 1 < ${#argv[@]}; i++)); do
        [[ ${argv[i]} == "$a" && ${argv[i + 1]} == "$b" ]] && return 0
    done
    return 1
}

# pids_with_args A B: live PIDs whose argv holds "A B" (see proc_argv_has).
pids_with_args() {
    local d pid
    for d in /proc/[0-9]*; do
        pid=${d#/proc/}
        [[ $pid == "$$" || $pid == "${BASHPID:-}" ]] && continue
        proc_argv_has "$pid" "$1" "$2" && proc_alive "$pid" && echo "$pid"
    done
    return 0
}

# containerd_pids: live containerd processes started with this testbed's config.
containerd_pids() { pids_with_args --config "$TB_CONFIG"; }

# shim_pids: live shims serving this testbed's containerd (they outlive containerd).
shim_pids() { pids_with_args -address "$TB_SOCK"; }

# stop_pids GRACE_SECONDS PID...: SIGTERM, wait up to GRACE, then SIGKILL and wait up to
# 5 s more. Liveness is proc_alive, so a zombie counts as gone.
stop_pids() {
    local grace=$1 pid waited
    shift
    (($# > 0)) || return 0
    kill -TERM "$@" 2>/dev/null || true
    for ((waited = 0; waited < grace * 10; waited++)); do
        any_alive "$@" || return 0
        sleep 0.1
    done
    for pid in "$@"; do
        proc_alive "$pid" && kill -KILL "$pid" 2>/dev/null
    done
    for ((waited = 0; waited < 50; waited++)); do
        any_alive "$@" || return 0
        sleep 0.1
    done
    warn "still alive after SIGKILL: $*"
    return 1
}

# any_alive PID...: true when at least one PID is alive (not a zombie).
any_alive() {
    local pid
    for pid in "$@"; do
        proc_alive "$pid" && return 0
    done
    return 1
}

# mounts_under DIR: mount points strictly below DIR, most recent first (the order to
# unmount them in). Mountinfo escapes spaces etc. as \040-style octal.
mounts_under() {
    local dir=$1 line mp
    local -a fields
    local -a points=()
    while read -r line; do
        read -ra fields <<<"$line"
        mp=${fields[4]}
        [[ $mp == *\\* ]] && mp=$(printf '%b' "${mp//\\/\\0}")
        [[ $mp == "$dir"/* ]] && points+=("$mp")
    done </proc/self/mountinfo
    local i
    for ((i = ${#points[@]} - 1; i >= 0; i--)); do
        printf '%s\n' "${points[i]}"
    done
}

# ctrk ARGS...: ctr on this testbed's socket, in the CRI namespace, bounded in time.
ctrk() { timeout 20 "${CTR:-ctr}" --address "$TB_SOCK" -n k8s.io "$@"; }

# socket_answers: containerd's gRPC socket serves requests.
socket_answers() {
    [[ -S $TB_SOCK ]] && timeout 5 "${CTR:-ctr}" --address "$TB_SOCK" version >/dev/null 2>&1
}

# containerd_running: the recorded containerd is alive and matches our config.
containerd_running() {
    local pid
    [[ -f $TB_PIDFILE ]] || return 1
    read -r pid <"$TB_PIDFILE" || return 1
    proc_alive "$pid" && proc_argv_has "$pid" --config "$TB_CONFIG"
}
