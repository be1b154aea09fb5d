#!/usr/bin/env bash
# Two "hosts" on one machine: network namespaces lowbit-hA and lowbit-hB joined by a veth pair
# (10.77.0.1 <-> 10.77.0.2, private addresses that exist only inside these namespaces), each end
# shaped with tc to GBIT Gbit/s (default 2; "none": unshaped), the token bucket of
# lowbit.bench.netns.tc_args (burst of 4 ms of traffic). torchrun starts RANKS_PER_HOST ranks in each namespace
# (gloo over the veth: GLOO_SOCKET_IFNAME) and runs the lowbit command given after "--" on them.
# Needs root and iproute2; the namespaces are removed on exit, whatever happens.
#
#   bash scripts/two_hosts.sh -- eval ppl --tp 2 --allreduce int4+h+o16 --seqlen 512 --max-windows 4
#   GBIT=none RANKS_PER_HOST=1 bash scripts/two_hosts.sh -- eval ppl --tp 2 ...
set -euo pipefail
GBIT=${GBIT:-2}
RANKS_PER_HOST=${RANKS_PER_HOST:-1}
PORT=${PORT:-29577}
PY=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
A=lowbit-hA B=lowbit-hB
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "usage: $0 -- LOWBIT-ARGS..." >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "$0: needs root (network namespaces, tc)" >&2; exit 2; }
for t in ip tc; do command -v $t >/dev/null || { echo "$0: needs $t (iproute2)" >&2; exit 2; }; done

cleanup() { ip netns del $A 2>/dev/null || true; ip netns del $B 2>/dev/null || true; }
trap cleanup EXIT
cleanup
ip netns add $A
ip netns add $B
ip link add vA netns $A type veth peer name vB netns $B
ip -n $A addr add 10.77.0.1/24 dev vA
ip -n $B addr add 10.77.0.2/24 dev vB
for ns in $A $B; do ip -n $ns link set lo up; done
ip -n $A link set vA up
ip -n $B link set vB up
# token bucket on each sending side: both directions limited to GBIT
if [ "$GBIT" != none ]; then
    read -r -a TBF < <(PYTHONPATH="${PYTHONPATH:-}" "$PY" -c "from lowbit.bench.netns import tc_args; print(*tc_args($GBIT))")
    ip netns exec $A tc qdisc add dev vA root "${TBF[@]}"
    ip netns exec $B tc qdisc add dev vB root "${TBF[@]}"
fi
ip -n $A link show vA >/dev/null  # the pair is up; gloo itself connects across it

run() {  # $1 namespace, $2 interface, $3 node rank
    ip netns exec "$1" env GLOO_SOCKET_IFNAME="$2" PYTHONPATH="${PYTHONPATH:-}" \
        "$PY" -m torch.distributed.run --nnodes 2 --node-rank "$3" --nproc-per-node "$RANKS_PER_HOST" \
        --master-addr 10.77.0.1 --master-port "$PORT" -m lowbit "${@:4}"
}
start=$(date +%s.%N)
run $B vB 1 "$@" > /tmp/lowbit-two-hosts-B.log 2>&1 &
pid=$!
run $A vA 0 "$@"
wait $pid || { echo "host B failed:" >&2; tail -20 /tmp/lowbit-two-hosts-B.log >&2; exit 1; }
echo "two hosts (${RANKS_PER_HOST} rank(s) each, link ${GBIT} Gbit/s): $(echo "$(date +%s.%N) - $start" | bc) s wall"
