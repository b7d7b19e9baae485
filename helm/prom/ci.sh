#!/usr/bin/env bash
# The chart's alerts and dashboard against Prometheus itself, on recorded
# and on live data (helm/ci.sh only parses them).
#
#   bash helm/prom/ci.sh       # from anywhere; KEEP=1 keeps the temp dir
#
# Needs the Go toolchain and Debian's prometheus package (Prometheus and
# promtool; installed with apt-get when missing). Exits non-zero when a
# check fails. Steps:
#
#  1. The chart's PrometheusRule, rendered with the chart's defaults but
#     three replicas (helm template, the Helm binary helm/ci.sh builds and
#     caches) and turned into a plain rules file (helm/prom/promcheck
#     rules): `promtool check rules`, then `promtool test rules` with
#     helm/prom/rules_test.yaml, which makes every alert fire on recorded
#     series (its labels and annotations checked in full) and stay quiet
#     on healthy ones.
#  2. Live, on loopback: one worker on its embedded NATS (namespace
#     "single") and a cluster of three NATS servers and three members with
#     --partition-owner dynamic/4 (namespace "cluster"), scraped every
#     second by a real Prometheus that loads the chart's rules rendered
#     for each namespace with helm/prom/live-values.yaml (single: static
#     ownership, one replica; cluster: dynamic, three): the same
#     expressions, with `for`, windows and thresholds shortened to seconds
#     (so an induced condition fires, and a removed one resolves, within
#     the run). Its targets come from files (file_sd), one per namespace,
#     with the labels the chart's ServiceMonitor gives them (job = the
#     Service's name, namespace, pod), so that a pod can also "go away"
#     (its target removed, as when it is deleted or Pending). Then:
#       - after some load, every dashboard panel's query (Grafana's
#         variables as "All", $__rate_interval as 1m) and every alert's
#         expression is evaluated through /api/v1/query: each must
#         evaluate, each of its selectors must match series (a wrong
#         metric or label name fails), and each panel must show data
#         (the members checkpoint every 5 s so that the checkpoint panel has
#         data);
#       - the alerts that can be induced on one machine fire (checked in
#         /api/v1/alerts with their key labels, expanded annotations and
#         runbook link) and resolve once the condition is removed:
#           TelhaWorkerDown            a member killed (its pod's up == 0,
#                                      until it is restarted); the single
#                                      worker stopped (up == 0: every
#                                      worker of the namespace down), then
#                                      its target removed too (no target
#                                      at all: absent(), value 0) while a
#                                      member's target is removed (2 of 3
#                                      scraped), then both put back
#           TelhaJournalStuck          a 20000-edge cascade journaled in
#                                      chunks of 7 puts (single; 9000 took
#                                      3.4 s on a fast day: too short to fire)
#           TelhaDeadLettersIncreasing invalid requests (single, cluster)
#           TelhaSlotWithoutOwner      a member killed with SIGKILL: its
#                                      slots have no owner until the
#                                      member TTL passes and a standby
#                                      takes over
#           TelhaOldestRequestWaiting  the consumer paused (enqueue pause)
#           TelhaConsumerBacklogGrowing  with requests published steadily
#                                      meanwhile, right after a load that
#                                      drained (which must not hold it back)
#           TelhaReaperNotSucceeding   the worker restarted with
#                                      --reaper-schedule "@every 1h", then
#                                      with the short schedule again
#           TelhaRedeliveriesHigh      the worker restarted with a disk
#                                      reserve larger than the disk
#                                      (--min-free-disk-mb): every write is
#                                      refused as transient, requests are
#                                      redelivered, then dead-lettered
#                                      (TelhaDeadLettersIncreasing with
#                                      reason retries_exhausted)
#     The others are covered by promtool test rules only (step 1):
#           TelhaStandbyLagging        a standby's lag is the owner's last
#                                      reported sequence minus its own; it
#                                      catches up within a heartbeat, and a
#                                      stopped (SIGSTOP) standby is not
#                                      scraped, so its lag series vanishes
#                                      rather than grows
#           TelhaDeadLetterFailures, TelhaDeadLetterResultFailures,
#           TelhaResultsParked         need TELHA_DLQ or TELHA_RES to refuse
#                                      publishes for a message's whole
#                                      delivery budget (5 attempts with
#                                      back-off): breaking JetStream under a
#                                      running worker, not a condition a
#                                      test on one machine sets up cleanly
#           TelhaPoisonJournals        needs an undecodable or always
#                                      failing journal in the store
#           TelhaPebbleWriteStalls     needs Pebble to stall writes
#                                      (compaction behind), which a small
#                                      run does not reach reliably
#     (their expressions are still evaluated live, above).
#
# Ports (loopback only, PROM_PORT_BASE, default 25222): cluster NATS +0..2,
# routes +2000..2002, members' HTTP +4000..4002; the single worker's NATS
# +10, HTTP +4010; Prometheus +5000. They must be free. About 3-4 minutes
# on 2 cores (the builds are cached after the first run).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
helm_dir="$(dirname "$here")"
repo="$(dirname "$helm_dir")"
cd "$helm_dir"

start=$(date +%s)
base=${PROM_PORT_BASE:-25222}
tmp="$(mktemp -d)"
pids=()
cleanup() {
  local rc=$?
  set +e
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill -TERM "$p" 2>/dev/null; done
  local deadline=$((SECONDS + 5)) p alive
  while :; do # polling with a deadline: the members drain, then exit
    alive=
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ -n "$alive" ] && [ $SECONDS -lt $deadline ] || break
    sleep 0.2
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
  if [ "$rc" != 0 ]; then
    for f in "$tmp"/*.log; do [ -f "$f" ] && { echo "--- $f (tail)" >&2; tail -n 20 "$f" >&2; }; done
  fi
  if [ "${KEEP:-}" = 1 ]; then echo "prom/ci.sh: kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

say() { echo "== prom/ci.sh [$(($(date +%s) - start))s]: $*"; }
fail() { echo "FAIL $*" >&2; exit 1; }

# ---- Prometheus and promtool (Debian's package) ----
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  say "installing Debian's prometheus package (Prometheus and promtool)"
  if [ "$(id -u)" = 0 ]; then apt_get=apt-get; else apt_get="sudo apt-get"; fi
  export DEBIAN_FRONTEND=noninteractive
  # The package's service is never used (nor needed): this script runs its own.
  $apt_get install -y prometheus >/dev/null 2>&1 || { $apt_get update >/dev/null && $apt_get install -y prometheus >/dev/null; }
fi
prometheus --version 2>&1 | head -n 1
promtool --version 2>&1 | head -n 1

# ---- Helm (as helm/ci.sh: built once from helm/go.mod, cached) ----
key="$(cat go.mod go.sum <(go version) | sha256sum | cut -c1-16)"
cache="${TELHA_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/telha-cascade/helm}"
HELM_BIN="$cache/helm-$key"
if [ ! -x "$HELM_BIN" ]; then
  say "build helm (go tool, pinned in helm/go.mod) into $HELM_BIN"
  mkdir -p "$cache"
  go build -o "$HELM_BIN.tmp.$$" helm.sh/helm/v4/cmd/helm
  mv "$HELM_BIN.tmp.$$" "$HELM_BIN"
fi
export HELM_CACHE_HOME="$tmp/helm/cache" HELM_CONFIG_HOME="$tmp/helm/config" HELM_DATA_HOME="$tmp/helm/data"

say "build promcheck (helm/prom/promcheck)"
go build -o "$tmp/promcheck" ./prom/promcheck
pc="$tmp/promcheck"

render_rules() { # render_rules NAMESPACE OUT [helm flags...]
  local ns=$1 out=$2
  shift 2
  "$HELM_BIN" template telha ./telha-cascade --namespace "$ns" --show-only templates/prometheusrule.yaml "$@" |
    "$pc" rules >"$out"
}

# ---- 1. recorded data: promtool ----
say "rules, chart defaults but three replicas: promtool check rules, promtool test rules (helm/prom/rules_test.yaml)"
mkdir -p "$tmp/unit"
# Three replicas (dynamic mode with more than one pod wants tokens): what
# TelhaWorkerDown's "fewer targets than replicas" is tested with.
render_rules graph "$tmp/unit/rules.yaml" --set prometheusRule.enabled=true,replicaCount=3,auth.tokensSecret=telha-tokens
cp "$here/rules_test.yaml" "$tmp/unit/rules_test.yaml"
promtool check rules "$tmp/unit/rules.yaml"
alerts_rendered=$(grep -c '^  - alert: ' "$tmp/unit/rules.yaml")
for a in $(sed -n 's/^  - alert: //p' "$tmp/unit/rules.yaml"); do
  grep -q "alertname: $a\$" "$here/rules_test.yaml" || fail "alert $a has no test in helm/prom/rules_test.yaml"
done
(cd "$tmp/unit" && promtool test rules rules_test.yaml)
echo "ok   promtool test rules: all $alerts_rendered alerts fire on recorded series and stay quiet on healthy ones"

# ---- 2. live data ----
say "rules for the live run (helm/prom/live-values.yaml), namespaces single and cluster"
# What each namespace runs: one static worker; three dynamic members.
render_rules single "$tmp/rules-single.yaml" -f "$here/live-values.yaml" --set ownership.mode=static
render_rules cluster "$tmp/rules-cluster.yaml" -f "$here/live-values.yaml" --set replicaCount=3,auth.tokensSecret=telha-tokens
for ns in single cluster; do promtool check rules "$tmp/rules-$ns.yaml" >/dev/null; done
echo "ok   promtool check rules: live rules for single and cluster"

for port in $((base + 10)) $((base + 4010)) $((base + 5000)); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then fail "port $port is in use (set PROM_PORT_BASE)"; fi
done
for i in 0 1 2; do
  for port in $((base + i)) $((base + 2000 + i)) $((base + 4000 + i)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then fail "port $port is in use (set PROM_PORT_BASE)"; fi
  done
done

say "build the worker, enqueue and nats-server"
(cd "$repo" && go build -o "$tmp/worker" ./cmd/worker && go build -o "$tmp/enqueue" ./cmd/enqueue &&
  go build -o "$tmp/nats-server" github.com/nats-io/nats-server/v2)

prom="http://127.0.0.1:$((base + 5000))"
single_nats="nats://127.0.0.1:$((base + 10))"
single_http="http://127.0.0.1:$((base + 4010))"
member_http() { echo "http://127.0.0.1:$((base + 4000 + $1))"; }
routes="nats-route://127.0.0.1:$((base + 2000)),nats-route://127.0.0.1:$((base + 2001)),nats-route://127.0.0.1:$((base + 2002))"
urls="nats://127.0.0.1:$base,nats://127.0.0.1:$((base + 1)),nats://127.0.0.1:$((base + 2))"
job=telha-telha-cascade # the chart's fullname for release telha: what its alert selector expects

# The single worker: the reaper every 2 s (the live alert wants a success
# within 10 s); small batches and chunks of 7 puts, so a hub's cascade is
# journaled and takes seconds.
single_pid=
start_single() { # start_single REAPER_SCHEDULE [FLAGS...]
  local schedule=$1
  shift
  "$tmp/worker" --data-dir "$tmp/single" --nats-listen "127.0.0.1:$((base + 10))" --http-addr "127.0.0.1:$((base + 4010))" \
    --max-batch-ops 100 --journal-chunk-ops 7 --reaper-schedule "$schedule" "$@" >>"$tmp/single.log" 2>&1 &
  single_pid=$!
  pids+=("$single_pid")
}
stop_single() {
  kill -TERM "$single_pid"
  local deadline=$((SECONDS + 60))
  while kill -0 "$single_pid" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || fail "the single worker did not exit within 60s of SIGTERM"
    sleep 0.1 # polling with a deadline
  done
}
# Requests to the single worker, a few every half second, until killed.
flood() { # flood REQUEST_ID_PREFIX
  while :; do
    for n in 1 2 3 4 5; do
      echo "{\"request_id\":\"$1-$RANDOM$RANDOM\",\"op\":\"put_node\",\"tenant\":\"t$n\",\"id\":\"$(cat /proc/sys/kernel/random/uuid)\"}"
    done | "$tmp/enqueue" --nats-url "$single_nats" file - >/dev/null 2>&1 || true
    sleep 0.5
  done
}
# The scrape targets of a namespace (a file_sd file, replaced atomically):
# the pods listed (single: 0), with the labels the chart's ServiceMonitor
# gives them. A pod left out is one Prometheus has no target for (deleted,
# Pending).
targets() { # targets NAMESPACE [I...]
  local ns=$1 i port
  shift
  {
    [ $# -gt 0 ] || echo "[]"
    for i in "$@"; do
      if [ "$ns" = single ]; then port=$((base + 4010)); else port=$((base + 4000 + i)); fi
      echo "- targets: ['127.0.0.1:$port']"
      echo "  labels: {namespace: $ns, pod: $job-$i}"
    done
  } >"$tmp/targets/.$ns.tmp"
  mv "$tmp/targets/.$ns.tmp" "$tmp/targets/$ns.yaml"
}
wait_http() { # wait_http WHAT URL SECONDS
  local deadline=$((SECONDS + $3))
  until [ "$(curl -s -o /dev/null -w '%{http_code}' "$2")" = 200 ]; do
    [ $SECONDS -lt $deadline ] || fail "$1: $2 not 200 within $3s"
    sleep 0.2 # polling with a deadline
  done
  echo "ok   $1"
}

say "start: one worker (embedded NATS), three NATS servers, three members"
start_single "@every 2s"
for i in 0 1 2; do
  "$tmp/nats-server" -n "n$i" -a 127.0.0.1 -p $((base + i)) -js -sd "$tmp/nats$i" \
    --cluster_name telha --cluster "nats://127.0.0.1:$((base + 2000 + i))" --routes "$routes" \
    >"$tmp/nats$i.log" 2>&1 &
  pids+=($!)
done
member_pid=()
start_member() { # start_member I
  "$tmp/worker" --nats-url "$urls" --partition-owner dynamic/4 --member-id "$job-$1" \
    --http-addr "127.0.0.1:$((base + 4000 + $1))" --data-dir "$tmp/m$1" --reaper-schedule "@every 2s" --checkpoint-schedule "@every 5s" \
    >>"$tmp/m$1.log" 2>&1 &
  member_pid[$1]=$!
  pids+=($!)
}
for i in 0 1 2; do start_member "$i"; done

cat >"$tmp/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - $tmp/rules-single.yaml
  - $tmp/rules-cluster.yaml
scrape_configs:
  # One job, as the chart's ServiceMonitor makes it (job = the Service's
  # name), with the namespace and pod labels it adds (see targets).
  - job_name: $job
    file_sd_configs:
      - files: ['$tmp/targets/*.yaml']
        refresh_interval: 1s
EOF
mkdir -p "$tmp/targets"
targets single 0
targets cluster 0 1 2
promtool check config "$tmp/prometheus.yml" >/dev/null
prometheus --config.file "$tmp/prometheus.yml" --storage.tsdb.path "$tmp/prometheus" \
  --web.listen-address "127.0.0.1:$((base + 5000))" --storage.tsdb.retention.time 1h \
  >"$tmp/prometheus.log" 2>&1 &
pids+=($!)

wait_http "Prometheus is ready" "$prom/-/ready" 60
wait_http "the single worker is ready" "$single_http/readyz" 120
for i in 0 1 2; do wait_http "member $i is ready" "$(member_http "$i")/readyz" 120; done
spread() { # each member owns a slot
  local v
  v=$(curl -s "$(member_http 0)/v1/partitions")
  for i in 0 1 2; do echo "$v" | grep -q "\"owner\":\"$job-$i\"" || return 1; done
}
deadline=$((SECONDS + 240))
until spread; do
  [ $SECONDS -lt $deadline ] || fail "the four slots were not spread over the three members within 120s"
  sleep 0.2 # polling with a deadline
done
echo "ok   the four slots are spread over the three members"
"$pc" wait -url "$prom" -q "up{job=\"$job\"} == 1" -min 4 -timeout 60s -what "Prometheus scrapes the four targets"
"$pc" wait -url "$prom" -q "telha_partition_standby_lag{namespace=\"cluster\"}" -min 4 -timeout 60s \
  -what "every slot has a standby reporting its lag"
"$pc" quiet -url "$prom" -timeout 90s
alert() { "$pc" alert -url "$prom" "$@"; }

say "load: requests on both, a journaled cascade on the single worker, reads"
reqs="$tmp/load.jsonl"
: >"$reqs"
for n in $(seq 1 80); do
  id=$(cat /proc/sys/kernel/random/uuid)
  echo "{\"request_id\":\"load-$n\",\"op\":\"put_node\",\"tenant\":\"t$((n % 8))\",\"id\":\"$id\"}" >>"$reqs"
  [ $((n % 4)) = 0 ] && echo "{\"request_id\":\"load-$n-del\",\"op\":\"tombstone_node\",\"tenant\":\"t$((n % 8))\",\"id\":\"$id\"}" >>"$reqs"
done
"$tmp/enqueue" --nats-url "$urls" --wait --timeout 60s file "$reqs" >"$tmp/load-cluster.out" || fail "the cluster's load was not answered ok"
echo "ok   cluster: $(wc -l <"$reqs") requests answered ok"
"$tmp/enqueue" --nats-url "$single_nats" --wait --timeout 60s file "$reqs" >"$tmp/load-single.out" || fail "the single worker's load was not answered ok"
"$tmp/enqueue" --nats-url "$single_nats" demo --people 20 --hub-edges 300 --http "$single_http" >"$tmp/demo-small.out" ||
  fail "enqueue demo on the single worker failed"
grep -q '"journaled":true' "$tmp/demo-small.out" || fail "the small demo's hub was not journaled"
echo "ok   single: $(wc -l <"$reqs") requests and a demo graph (its hub's cascade journaled) answered ok"

# Right after that load drained: growth is measured over a short window,
# so the drain cannot hold TelhaConsumerBacklogGrowing back.
say "induce: the single worker's consumer paused while requests keep arriving"
"$tmp/enqueue" --nats-url "$single_nats" pause --replica 0 >/dev/null
flood held &
flood_pid=$!
pids+=("$flood_pid")
alert -alert TelhaOldestRequestWaiting -match namespace=single -labels severity=warning,pod=$job-0 -want firing -timeout 60s
alert -alert TelhaConsumerBacklogGrowing -match namespace=single -labels severity=warning,pod=$job-0 -want firing -timeout 60s
kill -TERM "$flood_pid"
wait "$flood_pid" 2>/dev/null || true
"$tmp/enqueue" --nats-url "$single_nats" resume --replica 0 >/dev/null
echo "ok   stopped publishing; resumed the consumer"
alert -alert TelhaOldestRequestWaiting -match namespace=single -want resolved -timeout 60s
alert -alert TelhaConsumerBacklogGrowing -match namespace=single -want resolved -timeout 60s
for i in 0 1 2; do curl -s -o /dev/null "$(member_http "$i")/v1/tenants/t1/nodes/$(cat /proc/sys/kernel/random/uuid)"; done
# Scrapes and rates after the load: a 1m rate needs two samples after it.
"$pc" wait -url "$prom" -q "sum by (namespace) (rate(telha_requests_total{job=\"$job\",status=\"ok\"}[1m])) > 0" -min 2 -timeout 30s \
  -what "request rates are up in both namespaces"

say "every dashboard query and alert expression on live data"
# Every panel must show data (the members checkpoint every 5 s so that
# "Checkpoint age" has some; NaN from a quantile of no observations counts
# as data). A panel that may legitimately be empty here would be listed in
# -allow-empty (a regexp of queries), with the reason.
"$pc" dashboard -url "$prom" -dashboard ./telha-cascade/files/dashboard.json -rate 1m
"$pc" exprs -url "$prom" -rules "$tmp/rules-cluster.yaml"
# Rendered static: no telha_partition_* alerts there.
"$pc" exprs -url "$prom" -rules "$tmp/rules-single.yaml"

say "induce alerts: a long journal (single), dead letters (both), a member killed (cluster)"
"$tmp/enqueue" --nats-url "$single_nats" demo --tenant stuck --people 20 --hub-edges 20000 --http "$single_http" \
  >"$tmp/demo-big.out" 2>&1 &
demo_pid=$!
pids+=("$demo_pid")
bad='{"request_id":"bad-1","tenant":"acme","op":"no_such_op"}
{"request_id":"bad-2","tenant":"acme","op":"put_node","id":"not-a-uuid"}
{"request_id":"bad-3","tenant":"t3","op":"put_edge"}'
echo "$bad" | "$tmp/enqueue" --nats-url "$single_nats" file - >/dev/null
echo "$bad" | "$tmp/enqueue" --nats-url "$urls" file - >/dev/null
victim=1
kill -KILL "${member_pid[$victim]}"
{ wait "${member_pid[$victim]}"; } 2>/dev/null || true # reaped here: no "Killed" line from the shell
echo "ok   published 3 invalid requests to each; SIGKILL of member $victim"
# The slot is ownerless for about the member TTL (6 s): checked first.
alert -alert TelhaSlotWithoutOwner -match namespace=cluster -labels severity=critical -want firing -timeout 30s
alert -alert TelhaWorkerDown -match namespace=cluster,pod=$job-$victim -labels severity=critical -want firing -timeout 30s
alert -alert TelhaDeadLettersIncreasing -match namespace=single,reason=invalid -labels severity=warning,pod=$job-0 -want firing -timeout 30s
alert -alert TelhaDeadLettersIncreasing -match namespace=cluster,reason=invalid -labels severity=warning -want firing -timeout 30s
alert -alert TelhaJournalStuck -match namespace=single -labels severity=critical,pod=$job-0 -want firing -timeout 120s

say "remove them: the journal finishes, a standby takes the slots over, the dead-letter window passes"
deadline=$((SECONDS + 240))
while kill -0 "$demo_pid" 2>/dev/null; do
  [ $SECONDS -lt $deadline ] || fail "the big demo did not finish within 240s"
  sleep 0.2 # polling with a deadline
done
wait "$demo_pid" || fail "enqueue demo (20000 edges) failed: $(tail -n 3 "$tmp/demo-big.out")"
grep -q '"journaled":true' "$tmp/demo-big.out" || fail "the big demo's hub was not journaled"
alert -alert TelhaJournalStuck -match namespace=single -want resolved -timeout 60s
alert -alert TelhaSlotWithoutOwner -match namespace=cluster -want resolved -timeout 120s
start_member "$victim"
wait_http "member $victim is ready again (restarted)" "$(member_http "$victim")/readyz" 120
alert -alert TelhaWorkerDown -match namespace=cluster -want resolved -timeout 60s

alert -alert TelhaDeadLettersIncreasing -match namespace=single -want resolved -timeout 60s
alert -alert TelhaDeadLettersIncreasing -match namespace=cluster -want resolved -timeout 60s

say "induce: every worker of namespace single down (stopped), then no target at all there, and one member of three not scraped"
# Stopped: its target stays, up == 0 (a crash-looping pod). Then its
# target removed too (a deleted or Pending pod: absent(up), 0 scraped) and
# member 2's (2 of 3 scraped), then put back.
stop_single
alert -alert TelhaWorkerDown -match namespace=single,pod=$job-0 -labels severity=critical -want firing -timeout 30s
targets single
targets cluster 0 1
alert -alert TelhaWorkerDown -match namespace=single,pod= -labels severity=critical -value 0 -want firing -timeout 30s
alert -alert TelhaWorkerDown -match namespace=cluster,pod= -labels severity=critical -value 2 -want firing -timeout 30s
targets single 0
targets cluster 0 1 2
alert -alert TelhaWorkerDown -match namespace=cluster -want resolved -timeout 30s
alert -alert TelhaWorkerDown -match namespace=single,pod= -want resolved -timeout 30s

say "induce: the single worker's disk \"full\" (restart with --min-free-disk-mb 1PiB) while requests arrive"
# Every write is refused as transient: each request is redelivered until
# its last delivery, then dead-lettered as retries_exhausted. The worker is
# alive (/healthz, scraped: not down) but not ready.
start_single "@every 2s" --min-free-disk-mb 1073741824
wait_http "the single worker is alive again (disk reserve not met)" "$single_http/healthz" 120
alert -alert TelhaWorkerDown -match namespace=single -want resolved -timeout 30s
flood full &
flood_pid=$!
pids+=("$flood_pid")
alert -alert TelhaRedeliveriesHigh -match namespace=single -labels severity=warning,pod=$job-0 -want firing -timeout 60s
alert -alert TelhaDeadLettersIncreasing -match namespace=single,reason=retries_exhausted -labels severity=warning,pod=$job-0 -want firing -timeout 60s
kill -TERM "$flood_pid"
wait "$flood_pid" 2>/dev/null || true
echo "ok   stopped publishing"
alert -alert TelhaRedeliveriesHigh -match namespace=single -want resolved -timeout 60s

say "induce: the single worker's reaper stopped (restart with --reaper-schedule \"@every 1h\"), then back"
stop_single
start_single "@every 1h"
wait_http "the single worker is ready again (reaper every hour)" "$single_http/readyz" 120
alert -alert TelhaReaperNotSucceeding -match namespace=single -labels severity=critical,pod=$job-0 -want firing -timeout 60s
stop_single
start_single "@every 2s"
wait_http "the single worker is ready again (reaper every 2s)" "$single_http/readyz" 120
alert -alert TelhaReaperNotSucceeding -match namespace=single -want resolved -timeout 60s

say "all quiet again"
"$pc" quiet -url "$prom" -timeout 60s

say "OK in $(($(date +%s) - start))s"
