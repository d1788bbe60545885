# shellcheck shell=bash
# Cached builds of Go programs from the modules pinned in this repository (controlplane/*,
# runtime/*), shared by scripts/cluster (the control plane, upstream's kubelet),
# scripts/testbed (containerd 2.x and runc) and scripts/conformance (e2e.test, ginkgo,
# agnhost). The caller defines log and die, and sets CACHE (where bin dirs go) and GO (from
# go_cmd) before build_dir; build_dir sets BUILD_TMP while it builds, for the caller's exit
# trap to remove. GOBUILD_TAGS, when set, adds -tags to the build (and to its stamp).

# go_cmd: the Go toolchain (the official tarball's place when it is not on PATH).
go_cmd() {
    if command -v go >/dev/null; then
        command -v go
    elif [[ -x /usr/local/go/bin/go ]]; then
        echo /usr/local/go/bin/go
    else
        die "no Go toolchain (go on PATH or /usr/local/go/bin/go); the control plane is built from source"
    fi
}

# module_version MODDIR MODULE: the version MODDIR's go.mod requires (after any replace).
module_version() {
    local v
    v=$(cd "$1" && GOTOOLCHAIN=local "$GO" list -m \
        -f '{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}' "$2") ||
        die "cannot read the version of $2 from $1/go.mod"
    [[ $v =~ ^v[0-9]+\.[0-9]+\.[0-9]+ ]] || die "unexpected version '$v' of $2 in $1/go.mod"
    echo "$v"
}

# build_dir NAME MODDIR LDFLAGS PROGRAM... -- PACKAGE...: make CACHE/NAME hold PROGRAMs
# built from PACKAGEs in MODDIR, unless its stamp says it already does. The stamp is a
# hash of the module files, the toolchain, the flags (and CGO_ENABLED) and the package
# list. A PACKAGE written test:PATH is a test binary (`go test -c`, named after PATH's last
# element with .test), the others are `go build`. The build goes to a temporary dir that is
# renamed into place, so an interrupted build leaves no cache.
build_dir() {
    local name=$1 moddir=$2 ldflags=$3
    shift 3
    local -a programs=() packages=()
    while (($#)) && [[ $1 != -- ]]; do
        programs+=("$1")
        shift
    done
    shift
    packages=("$@")
    local out=$CACHE/$name stamp have="" p ok=1 started tmp old
    local -a flags=(-trimpath -buildvcs=false -ldflags "$ldflags")
    # Only when set, so that the stamps of builds without tags stay what they were.
    if [[ -n ${GOBUILD_TAGS:-} ]]; then flags+=(-tags "$GOBUILD_TAGS"); fi
    stamp=$(
        {
            "$GO" version
            printf 'flags: %s\n' "${flags[*]}"
            printf 'packages: %s\n' "${packages[*]}"
            if [[ -n ${CGO_ENABLED:-} ]]; then printf 'cgo: %s\n' "$CGO_ENABLED"; fi
            for p in "$moddir"/go.mod "$moddir"/go.sum "$moddir"/*.go "$moddir"/*/*.go; do
                if [[ -f $p ]]; then sha256sum "$p" | sed "s|$moddir/||"; fi
            done
        } | sha256sum | cut -d' ' -f1
    )
    if [[ -f $out/.stamp ]]; then read -r have <"$out/.stamp" || have=""; fi
    for p in "${programs[@]}"; do
        [[ -x $out/$p ]] || ok=0
    done
    if [[ $have == "$stamp" ]] && ((ok)); then
        log "reusing $out (stamp matches)"
        return 0
    fi
    if [[ -d $out ]]; then
        log "rebuilding $name: the pin, toolchain or flags changed (or the cache is incomplete)"
    else
        log "building $name (a cold build takes long; later builds reuse Go's build cache)"
    fi
    tmp=$CACHE/.$name.tmp.$$
    rm -rf "$tmp"
    mkdir -p "$tmp"
    BUILD_TMP=$tmp
    started=$SECONDS
    local -a built=() tests=()
    for p in "${packages[@]}"; do
        if [[ $p == test:* ]]; then tests+=("${p#test:}"); else built+=("$p"); fi
    done
    if ((${#built[@]})) &&
        ! (cd "$moddir" && GOTOOLCHAIN=local "$GO" build "${flags[@]}" -o "$tmp/" "${built[@]}"); then
        rm -rf "$tmp"
        die "go build of $name failed (in $moddir)"
    fi
    for p in "${tests[@]}"; do
        if ! (cd "$moddir" && GOTOOLCHAIN=local "$GO" test -c -vet=off "${flags[@]}" -o "$tmp/" "$p"); then
            rm -rf "$tmp"
            die "go test -c $p for $name failed (in $moddir)"
        fi
    done
    for p in "${programs[@]}"; do
        [[ -x $tmp/$p ]] || die "go build of $name did not produce $p"
    done
    echo "$stamp" >"$tmp/.stamp"
    old=""
    if [[ -e $out ]]; then
        old=$CACHE/.$name.old.$$
        mv "$out" "$old"
    fi
    mv "$tmp" "$out"
    BUILD_TMP=""
    if [[ -n $old ]]; then rm -rf "$old"; fi
    log "built $name in $((SECONDS - started))s: $(du -sh "$out" | cut -f1) in $out"
}

# k8s_version_ldflags VERSION: -X flags that stamp VERSION (vX.Y.Z) where upstream's build
# stamps it: component-base (--version, /version) and client-go (the User-Agent).
k8s_version_ldflags() {
    local version=$1 major minor rest vp ld=""
    rest=${version#v}
    major=${rest%%.*}
    rest=${rest#*.}
    minor=${rest%%.*}
    for vp in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ld+=" -X $vp.gitVersion=$version -X $vp.gitMajor=$major -X $vp.gitMinor=$minor -X $vp.gitTreeState=clean"
    done
    echo "${ld# }"
}
