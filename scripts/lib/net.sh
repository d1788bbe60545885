# shellcheck shell=bash
# Network side of the testbed: the CNI conflist, and finding/removing what the bridge,
# host-local and portmap plugins leave behind when pods are removed without a CNI DEL
# (which is what happens when `down` deletes CRI sandboxes through ctr).
#
# Ownership rules (several testbeds may share the machine, each with its own bridge,
# subnet and network name "deckhand-<bridge>"):
#   - the config has netns_mounts_under_state_dir, so CRI pins netns under DIR/state and
#     unmounting DIR covers them; for a containerd without it, a netns in /var/run/netns is
#     ours if a container of ours names it (recorded in DIR/owned), if its veth peer is a
#     port of our bridge, or if it appeared after `up` and holds an address in our subnet;
#   - an iptables rule is ours if its comment carries our network name (that is how the
#     bridge plugin's ipMasq rules and portmap's DNAT rules are tagged);
#   - a CNI result cache file is ours if it is named <netname>-<64 hex id>-<ifname>, or
#     cni-loopback-<id>-lo (containerd's own loopback network) for a sandbox id of ours.

CNI_RESULTS_DIR=/var/lib/cni/results
NETNS_DIR=/var/run/netns

# valid_bridge NAME: a Linux interface name we are willing to create and delete.
valid_bridge() { [[ $1 =~ ^[A-Za-z0-9_.-]{1,15}$ ]]; }

# valid_subnet CIDR: an IPv4 network a.b.c.d/len with room for a gateway and pods.
valid_subnet() {
    local ip=${1%/*} len=${1#*/} octet
    [[ $1 == */* && $len =~ ^[0-9]+$ ]] && ((len >= 8 && len <= 29)) || return 1
    [[ $ip =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || return 1
    for octet in ${ip//./ }; do
        ((10#$octet <= 255)) || return 1
    done
}

# ip_to_int A.B.C.D: the address as a 32-bit integer.
ip_to_int() {
    local a b c d
    IFS=. read -r a b c d <<<"$1"
    echo $(((10#$a << 24) | (10#$b << 16) | (10#$c << 8) | 10#$d))
}

# ip_in_cidr IP CIDR: IP lies inside CIDR.
ip_in_cidr() {
    local ip=$1 net=${2%/*} len=${2#*/} mask
    mask=$(((0xFFFFFFFF << (32 - len)) & 0xFFFFFFFF))
    ((($(ip_to_int "$ip") & mask) == ($(ip_to_int "$net") & mask)))
}

# write_conflist: the one network containerd loads (max_conf_num = 1). Must exist before
# containerd starts: CRI 1.6 ignores files that are moved into conf_dir later.
write_conflist() {
    mkdir -p "$TB_NETD" "$TB_IPAM"
    cat >"$TB_NETD/10-deckhand.conflist.tmp" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$NETNAME",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$TB_IPAM",
        "ranges": [[{ "subnet": "$SUBNET" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    },
    {
      "type": "portmap",
      "capabilities": { "portMappings": true }
    }
  ]
}
EOF
    mv "$TB_NETD/10-deckhand.conflist.tmp" "$TB_NETD/10-deckhand.conflist"
}

# bridge_exists: our bridge device is present.
bridge_exists() { ip link show dev "$BRIDGE" >/dev/null 2>&1; }

# bridge_ports: "ifindex name" of every interface enslaved to our bridge (host veth ends).
bridge_ports() {
    bridge_exists || return 0
    ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $1, $2 }'
}

# netns_names: every named netns (the pins under /var/run/netns).
netns_names() {
    local f
    for f in "$NETNS_DIR"/*; do
        [[ -e $f ]] && echo "${f##*/}"
    done
    return 0
}

# netns_peer_indexes NS: host-side ifindexes that NS's veths are paired with ("eth0@if12").
netns_peer_indexes() {
    ip -n "$1" -o link show 2>/dev/null | grep -o '@if[0-9]*' | cut -c4- || true
}

# netns_ipv4 NS: NS's IPv4 addresses, without prefix length.
netns_ipv4() {
    ip -n "$1" -o -4 addr show 2>/dev/null | awk '{ sub(/\/.*/, "", $4); print $4 }' || true
}

# owned_netns: names of the netns that belong to this testbed (see the rules on top).
owned_netns() {
    local ns idx addr
    local -A ours=() ports=() before=()
    while read -r ns; do
        [[ -n $ns && -e $NETNS_DIR/$ns ]] && ours[$ns]=1
    done < <(owned_list netns)
    while read -r idx _; do
        [[ -n $idx ]] && ports[$idx]=1
    done < <(bridge_ports)
    if [[ -f $TB_NETNS_BEFORE ]]; then
        while read -r ns; do
            [[ -n $ns ]] && before[$ns]=1
        done <"$TB_NETNS_BEFORE"
    fi
    while read -r ns; do
        [[ -n $ns && -z ${ours[$ns]:-} ]] || continue
        for idx in $(netns_peer_indexes "$ns"); do
            [[ -n ${ports[$idx]:-} ]] && ours[$ns]=1
        done
        [[ -n ${ours[$ns]:-} || -n ${before[$ns]:-} ]] && continue
        for addr in $(netns_ipv4 "$ns"); do
            ip_in_cidr "$addr" "$SUBNET" && ours[$ns]=1
        done
    done < <(netns_names)
    for ns in "${!ours[@]}"; do
        echo "$ns"
    done
}

# record_owned KIND VALUE...: remember a netns name, container id or cgroup path ("netns",
# "id", "cgroup") that belongs to us, in DIR/owned, which down keeps for leftovers.
record_owned() {
    local kind=$1 value
    shift
    for value in "$@"; do
        [[ $value =~ ^[A-Za-z0-9_./-]+$ && $value != *..* ]] || continue
        grep -qxF -- "$kind $value" "$TB_OWNED" 2>/dev/null || echo "$kind $value" >>"$TB_OWNED"
    done
}

# owned_list KIND: the values recorded with record_owned.
owned_list() {
    [[ -f $TB_OWNED ]] || return 0
    awk -v k="$1" '$1 == k { print $2 }' "$TB_OWNED"
}

# iptables_our_rules TABLE: `iptables -S` lines of TABLE whose comment names our network.
iptables_our_rules() {
    iptables -w 5 -t "$1" -S 2>/dev/null | grep -F -- "name: \\\"$NETNAME\\\"" || true
}

# iptables_cleanup: delete our tagged rules and the per-pod CNI-* chains they jump to.
# iptables-restore --noflush parses the quoted comments itself (no eval in bash); if the
# batch fails because another testbed changed the table meanwhile, retry line by line.
iptables_cleanup() {
    command -v iptables >/dev/null || return 0
    local table rules chain line
    local -a batch chains
    for table in nat filter mangle; do
        rules=$(iptables_our_rules "$table")
        [[ -n $rules ]] || continue
        batch=()
        chains=()
        while IFS= read -r line; do
            [[ $line == "-A "* ]] || continue
            batch+=("-D ${line#-A }")
            chain=$(grep -o -- '-j CNI-[A-Za-z0-9_-]*' <<<"$line" | cut -c4- || true)
            # CNI-HOSTPORT-* are portmap's global chains, shared with every network.
            [[ -n $chain && $chain != CNI-HOSTPORT-* ]] && chains+=("$chain")
        done <<<"$rules"
        mapfile -t chains < <(printf '%s\n' "${chains[@]}" | awk 'NF && !seen[$0]++')
        for chain in "${chains[@]}"; do
            batch+=("-F $chain" "-X $chain")
        done
        if ! { echo "*$table"; printf '%s\n' "${batch[@]}"; echo COMMIT; } |
            iptables-restore -w 5 --noflush 2>/dev/null; then
            for line in "${batch[@]}"; do
                printf '*%s\n%s\nCOMMIT\n' "$table" "$line" |
                    iptables-restore -w 5 --noflush 2>/dev/null || true
            done
        fi
    done
}

# cni_result_files: CNI's result cache entries (libcni: <net>-<id>-<if>) for our network,
# and for containerd's loopback network on our sandboxes.
cni_result_files() {
    local f base id
    for f in "$CNI_RESULTS_DIR/$NETNAME"-*; do
        [[ -e $f ]] || continue
        base=${f##*/}
        [[ ${base#"$NETNAME"-} =~ ^[0-9a-f]{64}-[A-Za-z0-9_.-]+$ ]] && echo "$f"
    done
    while read -r id; do
        [[ $id =~ ^[0-9a-f]{64}$ && -e $CNI_RESULTS_DIR/cni-loopback-$id-lo ]] &&
            echo "$CNI_RESULTS_DIR/cni-loopback-$id-lo"
    done < <(owned_list id; known_sandbox_ids)
    return 0
}

# known_sandbox_ids: the sandboxes CRI has on disk under DIR (gone after down).
known_sandbox_ids() {
    local d
    for d in "$TB_CRI_SANDBOXES"/*; do
        [[ -d $d ]] && echo "${d##*/}"
    done
    return 0
}

# lease_files: host-local leases (files named by IP) left in our IPAM data dir.
lease_files() {
    [[ -d $TB_IPAM ]] || return 0
    find "$TB_IPAM" -type f -regextype posix-extended -regex '.*/[0-9]+(\.[0-9]+){3}' 2>/dev/null || true
}

# network_cleanup: undo what CNI ADD did for our pods, for pods removed without CNI DEL.
# Order: netns first (that also deletes their veth pairs), then stray veths, the bridge,
# the nat rules, the result cache and the leases.
network_cleanup() {
    local ns name
    while read -r ns; do
        [[ -n $ns ]] || continue
        ip netns delete "$ns" 2>/dev/null || warn "could not delete netns $ns"
    done < <(owned_netns)
    while read -r _ name; do
        if [[ -n $name ]]; then ip link delete "$name" 2>/dev/null || true; fi
    done < <(bridge_ports)
    if bridge_exists; then
        if ip -d link show dev "$BRIDGE" | grep -qw bridge; then
            ip link delete "$BRIDGE" type bridge 2>/dev/null || warn "could not delete bridge $BRIDGE"
        else
            warn "$BRIDGE exists but is not a bridge; left alone"
        fi
    fi
    iptables_cleanup
    while read -r name; do
        rm -f "$name"
    done < <(cni_result_files)
    rm -rf "$TB_IPAM"
}
