#!/usr/bin/env bash
# Prepares this machine for the testnet's network lab (`testnet nat`, `testnet broadcast
# --rtt-ms …`, docs/netlab.md): checks that it runs as root, installs the userland tools it
# needs from the Debian packages when missing (iptables, iproute2), and probes the kernel
# features the lab uses: network namespaces, veth pairs, bridges, TUN devices, iptables NAT
# (MASQUERADE with --random-fully) and the tbf qdisc. It also reports whether `netem` exists;
# the lab never needs it (delay, jitter and loss come from its userspace TUN forwarder).
#
# Idempotent: run it as often as you like; it changes nothing that is already in place and
# removes every probe object it creates. Exit status 0 when every required feature works.
set -u

ok=0
fail=0
say() { printf '%-28s %s\n' "$1" "$2"; }
pass() { say "$1" "ok${2:+ ($2)}"; ok=$((ok + 1)); }
bad() { say "$1" "FAIL${2:+ ($2)}"; fail=$((fail + 1)); }

if [ "$(id -u)" != 0 ]; then
    echo "netlab-install: must run as root (network namespaces and NAT need CAP_NET_ADMIN)" >&2
    exit 1
fi
pass root "uid 0"

need_pkgs=()
command -v ip >/dev/null 2>&1 || need_pkgs+=(iproute2)
command -v iptables >/dev/null 2>&1 || need_pkgs+=(iptables)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    echo "installing: ${need_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null && apt-get install -y -qq "${need_pkgs[@]}" >/dev/null \
        || { bad packages "apt-get install ${need_pkgs[*]} failed"; exit 1; }
fi
pass iproute2 "$(ip -V 2>&1 | head -n1)"
if command -v iptables >/dev/null 2>&1; then
    pass iptables "$(iptables -V 2>&1 | head -n1)"
else
    bad iptables "not installed"
fi

# Probes in a throw-away namespace, removed on exit whatever happens.
ns="nlab-probe-$$"
trap 'ip netns del "$ns" 2>/dev/null' EXIT
if ip netns add "$ns" 2>/dev/null; then pass netns; else bad netns "ip netns add"; exit 1; fi
in_ns() { ip netns exec "$ns" "$@" >/dev/null 2>&1; }
in_ns ip link add va type veth peer name vb && pass veth || bad veth
in_ns ip link add br0 type bridge && pass bridge || bad bridge
in_ns ip tuntap add dev tun0 mode tun && pass tun "/dev/net/tun" || bad tun "ip tuntap add"
in_ns ip link set va up
in_ns ip addr add 10.99.0.1/24 dev va
if in_ns tc qdisc add dev va root tbf rate 10mbit burst 32kbit latency 50ms; then
    pass tbf
else
    bad tbf
fi
if in_ns tc qdisc replace dev va root netem delay 10ms; then
    say netem "present (unused: the lab's emulator is userspace)"
else
    say netem "absent (expected: the lab's TUN forwarder emulates delay, jitter and loss)"
fi
if command -v iptables >/dev/null 2>&1; then
    if in_ns iptables -t nat -A POSTROUTING -o va -j MASQUERADE --random-fully; then
        pass "iptables nat" "MASQUERADE --random-fully ($(iptables -V | grep -o '(.*)'))"
    else
        bad "iptables nat" "MASQUERADE rule rejected"
    fi
    if in_ns iptables -A FORWARD -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT; then
        pass conntrack
    else
        bad conntrack "-m conntrack rejected"
    fi
fi
echo "netlab-install: $ok ok, $fail failed"
[ "$fail" = 0 ]
