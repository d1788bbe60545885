# shellcheck shell=bash
# The testbed's two runtimes: containerd 2.x built from runtime/containerd (with runc from
# runtime/runc), the default, and Debian's packaged containerd 1.6. Sourced by scripts/testbed
# after common.sh and gobuild.sh; uses REPO and the TB_* paths.

CONTAINERD_MODULE=github.com/containerd/containerd/v2
RUNC_MODULE=github.com/opencontainers/runc
CONTAINERD_MODULE_DIR=$REPO/runtime/containerd
RUNC_MODULE_DIR=$REPO/runtime/runc
CONTAINERD_PROGRAMS=(containerd containerd-shim-runc-v2 ctr)

# runtime_cache: where the built runtime goes (the control plane's cache unless told).
runtime_cache() {
    echo "${DECKHAND_RUNTIME_CACHE:-${DECKHAND_CLUSTER_CACHE:-$REPO/.testbed/bin}}"
}

# ensure_runtime_built: build or reuse containerd 2.x and runc; sets CONTAINERD_BIN_DIR and
# RUNC_BIN_DIR. containerd and its shim are static Go programs (no cgo, as containerd's own
# release builds its shim); runc needs cgo and libseccomp (its seccomp build tag). Fails when
# runtime/runc does not pin the runc that the containerd release names.
ensure_runtime_built() {
    GO=$(go_cmd)
    CACHE=$(runtime_cache)
    local cv rv pinned dir ld
    cv=$(module_version "$CONTAINERD_MODULE_DIR" "$CONTAINERD_MODULE")
    rv=$(module_version "$RUNC_MODULE_DIR" "$RUNC_MODULE")
    dir=$(cd "$CONTAINERD_MODULE_DIR" && GOTOOLCHAIN=local "$GO" mod download -json "$CONTAINERD_MODULE@$cv" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p') || die "cannot download $CONTAINERD_MODULE@$cv"
    read -r pinned <"$dir/script/setup/runc-version" || die "no runc-version in $CONTAINERD_MODULE@$cv"
    [[ $pinned == "$rv" ]] ||
        die "containerd $cv pins runc $pinned but runtime/runc/go.mod requires $rv: update runtime/runc"
    CONTAINERD_BIN_DIR=$CACHE/containerd-$cv
    RUNC_BIN_DIR=$CACHE/runc-$rv
    mkdir -p "$CACHE"
    BUILD_TMP=""
    trap 'if [[ -n $BUILD_TMP ]]; then rm -rf "$BUILD_TMP"; fi' EXIT
    exec 8>>"$CACHE/.build.lock"
    flock -w 3600 8 || die "timed out waiting for another build ($CACHE/.build.lock)"
    rm -rf "$CACHE"/.containerd-*.tmp.* "$CACHE"/.runc-*.tmp.*
    # Where containerd's Makefile stamps its version (`containerd --version`, CRI Version).
    ld="-s -w -X $CONTAINERD_MODULE/version.Version=$cv -X $CONTAINERD_MODULE/version.Package=$CONTAINERD_MODULE"
    local -a pkgs=()
    local p
    for p in "${CONTAINERD_PROGRAMS[@]}"; do
        pkgs+=("$CONTAINERD_MODULE/cmd/$p")
    done
    CGO_ENABLED=0 build_dir "containerd-$cv" "$CONTAINERD_MODULE_DIR" "$ld" \
        "${CONTAINERD_PROGRAMS[@]}" -- "${pkgs[@]}"
    # runc's version is embedded from its VERSION file; no -X needed.
    [[ -f /usr/include/seccomp.h ]] || die "runc needs libseccomp-dev (run scripts/install-deps)"
    CGO_ENABLED=1 GOBUILD_TAGS=seccomp,urfave_cli_no_docs build_dir "runc-$rv" "$RUNC_MODULE_DIR" "-s -w" \
        runc -- "$RUNC_MODULE"
    exec 8>&-
}

# runtime_use 2|1.6: choose the runtime for `up`; sets RUNTIME, RUNTIME_PATH (the dirs of
# its programs, searched first) and CONTAINERD/CTR/RUNC.
runtime_use() {
    case $1 in
        2)
            ensure_runtime_built
            RUNTIME=2
            RUNTIME_PATH=$CONTAINERD_BIN_DIR:$RUNC_BIN_DIR
            ;;
        1.6)
            RUNTIME=1.6
            RUNTIME_PATH=""
            ;;
        *) die "--containerd must be 2 or 1.6, not '$1'" ;;
    esac
    runtime_tools
}

# runtime_tools: CTR and RUNC for what testbed.env recorded (the packaged ones for 1.6, or
# when nothing is recorded).
runtime_tools() {
    CTR=ctr RUNC=runc
    local d
    local -a dirs=()
    IFS=: read -ra dirs <<<"${RUNTIME_PATH:-}"
    for d in "${dirs[@]}"; do
        if [[ -x $d/ctr ]]; then CTR=$d/ctr; fi
        if [[ -x $d/runc ]]; then RUNC=$d/runc; fi
    done
    return 0
}

# write_config_v4: containerd 2's config in its current schema (version 4 in 2.4.2: the
# server's sockets are plugins of their own; version 3 had split CRI into the cri.v1.images and
# cri.v1.runtime plugins, the streaming server staying in grpc.v1.cri). Written in that schema,
# not as an older one containerd would migrate at each start (and warn about). The settings are
# the 1.6 config's (shared/docs/containerd-testbed.md). No drop-ins: containerd's default
# config imports /etc/containerd/conf.d/*.toml, and a machine's settings there must not change
# the tests'. NRI is off: it would listen on the machine-wide /var/run/nri/nri.sock.
write_config_v4() {
    cat <<EOF
# Written by scripts/testbed; rewritten on every start.
version = 4
root = "$TB_ROOT"
state = "$TB_STATE"
imports = []

[debug]
  level = "info"

[plugins]
  [plugins."io.containerd.server.v1.grpc"]
    address = "$TB_SOCK"

  [plugins."io.containerd.server.v1.ttrpc"]
    address = "$TB_TTRPC"

  [plugins."io.containerd.internal.v1.opt"]
    path = "$TB_OPT"

  [plugins."io.containerd.nri.v1.nri"]
    disable = true

  [plugins."io.containerd.grpc.v1.cri"]
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"

  [plugins."io.containerd.cri.v1.images"]
    snapshotter = "overlayfs"

    [plugins."io.containerd.cri.v1.images".pinned_images]
      sandbox = "$PAUSE_REF"

    # One hosts.toml per registry host, read at each pull (tests add a plain-HTTP registry).
    [plugins."io.containerd.cri.v1.images".registry]
      config_path = "$TB_CERTS_D"

  [plugins."io.containerd.cri.v1.runtime"]
    restrict_oom_score_adj = true
    disable_hugetlb_controller = true
    tolerate_missing_hugetlb_controller = true
    netns_mounts_under_state_dir = $NETNS_UNDER_STATE
    # CDI devices (CRI's CDIDevices) from the testbed's own spec directory only.
    enable_cdi = true
    cdi_spec_dirs = ["$TB_CDI"]

    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "runc"

      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        snapshotter = "overlayfs"

        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = "$TB_RUNC"
          BinaryName = "$RUNC"

    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = ["$CNI_BIN_DIR"]
      conf_dir = "$TB_NETD"
      max_conf_num = 1
EOF
}

# cmd_build: `testbed build`.
cmd_build() {
    (($# == 0)) || die "usage: testbed build"
    ensure_runtime_built
    echo "$CONTAINERD_BIN_DIR"
    echo "$RUNC_BIN_DIR"
}
