#!/usr/bin/env bash
# A cluster on one machine, as an SRE tries one before Kubernetes: three
# NATS servers (JetStream, clustered on loopback) and three members
# (--partition-owner dynamic/4), some load, a member killed with SIGKILL,
# and every node read back through the survivors.
#
#   bash docs/examples/cluster.sh            # from a clone; Go is all it needs
#
# What it shows (and checks; it exits non-zero when a check fails):
#   - the flags a member needs: --nats-url, --partition-owner dynamic/N,
#     --member-id, --http-addr and --data-dir; the changelog, the partitions
#     and the stream replicas follow from the layout and the cluster
#     (CONTRACT §7, "layout defaults");
#   - every member answers a read of every tenant (it forwards reads of the
#     slots it does not own);
#   - after a member is killed, its slots move to the survivors (about the
#     member TTL, 6 s) and every node written before and after still reads.
#
# Ports (loopback only): NATS clients CLUSTER_PORT_BASE (default 24222)
# +0..2, routes +2000..2002, members' HTTP +4000..4002 (28222..28224 by
# default). They must be free. CI runs this after the tests.
set -euo pipefail
cd "$(dirname "$0")/../.."

base=${CLUSTER_PORT_BASE:-24222}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${KEEP:-}" = 1 ]; then echo "cluster: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

for i in 0 1 2; do
  for port in $((base + i)) $((base + 2000 + i)) $((base + 4000 + i)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "cluster: port $port is in use (set CLUSTER_PORT_BASE)" >&2
      exit 1
    fi
  done
done

echo "== cluster: building nats-server, the worker and enqueue"
go build -o "$work/bin/nats-server" github.com/nats-io/nats-server/v2
go build -o "$work/bin/worker" ./cmd/worker
go build -o "$work/bin/enqueue" ./cmd/enqueue

routes="nats-route://127.0.0.1:$((base + 2000)),nats-route://127.0.0.1:$((base + 2001)),nats-route://127.0.0.1:$((base + 2002))"
urls="nats://127.0.0.1:$base,nats://127.0.0.1:$((base + 1)),nats://127.0.0.1:$((base + 2))"
echo "== cluster: three NATS servers (JetStream, cluster telha, routes $routes)"
for i in 0 1 2; do
  "$work/bin/nats-server" -n "n$i" -a 127.0.0.1 -p $((base + i)) -js -sd "$work/nats$i" \
    --cluster_name telha --cluster "nats://127.0.0.1:$((base + 2000 + i))" --routes "$routes" \
    >"$work/nats$i.log" 2>&1 &
  pids+=($!)
done

echo "== cluster: three members"
member_pid=()
for i in 0 1 2; do
  # The whole of a member's configuration on one machine:
  "$work/bin/worker" --nats-url "$urls" --partition-owner dynamic/4 --member-id "m$i" \
    --http-addr "127.0.0.1:$((base + 4000 + i))" --data-dir "$work/m$i" >"$work/m$i.log" 2>&1 &
  member_pid+=($!)
  pids+=($!)
done
http() { echo "http://127.0.0.1:$((base + 4000 + $1))"; }

fail=0
wait_for() { # wait_for DESCRIPTION SECONDS COMMAND...
  local what=$1 secs=$2
  shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      echo "cluster: FAIL: $what (not within ${secs}s)" >&2
      for f in "$work"/m*.log; do echo "--- $f" >&2; tail -n 15 "$f" >&2; done
      exit 1
    fi
    sleep 0.2 # polling with a deadline
  done
  echo "cluster: ok: $what"
}
ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' "$(http "$1")/readyz")" = 200 ]; }
for i in 0 1 2; do wait_for "member m$i is ready" 120 ready "$i"; done
spread() { # each member owns a slot, and all three are ready
  local v
  v=$(curl -s "$(http 0)/v1/partitions")
  for m in m0 m1 m2; do echo "$v" | grep -q "\"owner\":\"$m\"" || return 1; done
  ready 0 && ready 1 && ready 2
}
wait_for "the four slots are spread over the three members" 120 spread
curl -s "$(http 0)/v1/partitions" | grep -o '"slot":[0-9]*,"partitions":\[[0-9,]*\],"owner":"m[0-9]"'

echo "== cluster: load: 40 nodes over 8 tenants, each waited for"
export TELHA_NATS_URL="$urls"
nodes=()
put_nodes() { # put_nodes ROUND
  for n in $(seq 1 40); do
    local tenant="t$((n % 8))" id
    id=$(cat /proc/sys/kernel/random/uuid)
    if ! "$work/bin/enqueue" --wait --timeout 30s put-node --tenant "$tenant" --id "$id" --props "{\"round\":$1}" >/dev/null; then
      echo "cluster: FAIL: put-node $tenant/$id was not answered ok" >&2
      fail=1
    fi
    nodes+=("$tenant/$id")
  done
}
put_nodes 1

read_all() { # read_all MEMBER: every node reads 200 through it
  local bad=0
  for tn in "${nodes[@]}"; do
    local code
    code=$(curl -s -o /dev/null -w '%{http_code}' "$(http "$1")/v1/tenants/${tn%%/*}/nodes/${tn#*/}")
    [ "$code" = 200 ] || bad=$((bad + 1))
  done
  [ $bad = 0 ]
}
for i in 0 1 2; do wait_for "every node reads 200 through m$i" 30 read_all "$i"; done

echo "== cluster: SIGKILL of member m1"
kill -KILL "${member_pid[1]}"
moved() { # every slot owned by m0 or m2, and both ready
  curl -s "$(http 0)/v1/partitions" | grep -q '"owner":"m1"' && return 1
  ready 0 && ready 2
}
wait_for "m1's slots moved to m0 and m2" 120 moved
for i in 0 2; do wait_for "every node written before the kill reads 200 through m$i" 60 read_all "$i"; done
put_nodes 2
for i in 0 2; do wait_for "every node, before and after the kill, reads 200 through m$i" 60 read_all "$i"; done

[ $fail = 0 ] && echo "cluster: passed"
exit $fail
