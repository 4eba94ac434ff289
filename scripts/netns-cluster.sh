#!/bin/sh
# netns-cluster.sh: a cluster of two (or more) hosts on one machine, for loom's multi-node tests and benchmark.
#
#   scripts/netns-cluster.sh up        create it (idempotent: an existing one is torn down first)
#   scripts/netns-cluster.sh down      remove every namespace, link and qdisc it created
#   scripts/netns-cluster.sh mpirun ARGS...   run mpirun from host 0 over every host
#   scripts/netns-cluster.sh exec H CMD...    run CMD on host H (0, 1, ...) in its namespaces
#   scripts/netns-cluster.sh check     exit 0 when the cluster can be made here (root, ip netns)
#
# LOOM_NETNS_HOSTS (default 2, at most 8) network namespaces (the hosts, ${P}0, ${P}1, ...) each with
# one veth to a bridge that lives in one more namespace (${P}sw), addresses ${NET}.1, ${NET}.2, ...
# /24, nothing in the root namespace (the elastic tests use three hosts: docs/launcher.md). Each
# host's link is rate limited with tc tbf (LOOM_NETNS_RATE, default 2gbit; netem is not available
# everywhere) on the host side's egress: each direction of the link has the rate to itself (full
# duplex, like an Ethernet port). The bucket (LOOM_NETNS_BURST, default 256kb: 1 ms at 2 Gbit/s)
# is what may leave at once after an idle spell; it was 1mb, which let a 1 MiB all-reduce appear
# faster than the rate (107% "utilization"). The queue holds 100 ms at the rate. The links' MTU
# (LOOM_NETNS_MTU, default 1500, Ethernet's) sets how much of the rate TCP's headers take: about 4.5%
# at 1500 (66 bytes per 1448 of payload, and the acknowledgements going the other way), 0.7% with
# jumbo frames (9000, as many cluster networks use). Every command run
# on a host gets its own UTS namespace with the host's name, or OpenMPI's shared-memory segments
# (named after the hostname) of the two "hosts" collide. mpirun runs on host 0 and starts host 1's
# daemon through this script as its rsh agent. Needs root.
#
# Environment: LOOM_NETNS_PREFIX (default loomh), LOOM_NETNS_NET (default 10.231.7),
# LOOM_NETNS_RATE (default 2gbit), LOOM_NETNS_BURST (default 256kb), LOOM_NETNS_MTU (default 1500),
# LOOM_NETNS_PPN (ranks per host for `mpirun`, default 2), LOOM_NETNS_HOSTS (hosts, default 2).
set -eu
P=${LOOM_NETNS_PREFIX:-loomh}
NET=${LOOM_NETNS_NET:-10.231.7}
RATE=${LOOM_NETNS_RATE:-2gbit}
BURST=${LOOM_NETNS_BURST:-256kb}
MTU=${LOOM_NETNS_MTU:-1500}
PPN=${LOOM_NETNS_PPN:-2}
NH=${LOOM_NETNS_HOSTS:-2}
case "$NH" in [2-8]) ;; *) echo "netns-cluster.sh: LOOM_NETNS_HOSTS=$NH: expected 2..8" >&2; exit 2 ;; esac
HOSTS=$(seq 0 $((NH - 1)))
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")

down() {
	# every host a cluster of this prefix may have, whatever LOOM_NETNS_HOSTS it was made with
	for n in "${P}0" "${P}1" "${P}2" "${P}3" "${P}4" "${P}5" "${P}6" "${P}7" "${P}sw"; do
		ip netns del "$n" 2>/dev/null || true
	done
}

up() {
	down
	ip netns add "${P}sw"
	ip -n "${P}sw" link add "${P}br" type bridge
	ip -n "${P}sw" link set "${P}br" mtu "$MTU" up
	ip -n "${P}sw" link set lo up
	for h in $HOSTS; do
		ip netns add "${P}$h"
		ip -n "${P}$h" link set lo up
		ip link add "${P}e$h" netns "${P}$h" mtu "$MTU" type veth peer name "${P}p$h" netns "${P}sw" mtu "$MTU"
		ip -n "${P}sw" link set "${P}p$h" master "${P}br"
		ip -n "${P}sw" link set "${P}p$h" up
		ip -n "${P}$h" addr add "$NET.$((h + 1))/24" dev "${P}e$h"
		ip -n "${P}$h" link set "${P}e$h" up
		ip netns exec "${P}$h" tc qdisc replace dev "${P}e$h" root tbf rate "$RATE" burst "$BURST" latency 100ms
	done
}

# Run "$@" on host $1 in its own UTS namespace named after it.
on_host() {
	h=$1
	shift
	exec ip netns exec "${P}$h" unshare --uts sh -c 'hostname "$0"; exec "$@"' "${P}$h" "$@"
}

case "${1:-}" in
up) up ;;
down) down ;;
check)
	[ "$(id -u)" = 0 ] || { echo "not root"; exit 1; }
	command -v ip >/dev/null || { echo "no ip (iproute2)"; exit 1; }
	command -v mpirun >/dev/null || { echo "no mpirun"; exit 1; }
	ip netns add "${P}probe" 2>/dev/null || { echo "network namespaces unavailable"; exit 1; }
	ip netns del "${P}probe"
	;;
exec)
	shift
	on_host "$@"
	;;
mpirun)
	# Without --host among the arguments (as `loom run --hostfile` gives), every host with PPN ranks.
	shift
	hosts="--host $(for h in $HOSTS; do printf '%s' "${sep:-}$NET.$((h + 1)):$PPN"; sep=,; done)"
	for a in "$@"; do [ "$a" = --host ] && hosts=""; done
	# shellcheck disable=SC2086
	on_host 0 mpirun --allow-run-as-root $hosts \
		--mca plm_rsh_agent "$SELF" --mca btl tcp,vader,self \
		--mca btl_tcp_if_include "$NET.0/24" --mca oob_tcp_if_include "$NET.0/24" "$@"
	;;
-* | "$NET".*)
	# mpirun's rsh agent: [options] HOST COMMAND (COMMAND is a shell string).
	while [ "${1#-}" != "$1" ]; do shift; done
	host=$1
	shift
	on_host "$((${host##*.} - 1))" sh -c "$*"
	;;
*)
	sed -n '2,26p' "$0"
	exit 2
	;;
esac
