#!/usr/bin/env bash
# The queue-contract cases of the issue "The queue and HTTP contracts in a
# new user's hands", run against a worker binary ($1) on a fresh data dir
# with its embedded NATS, with the NATS CLI (NATS_CLI, default "nats":
# go install github.com/nats-io/natscli/nats@v0.5.0). Usage:
#   go build -o /tmp/worker ./cmd/worker && docs/examples/queue-contract-demo.sh /tmp/worker
set -u
BIN=$1; DIR=$(mktemp -d); NATS="${NATS_CLI:-nats} -s nats://127.0.0.1:14222"
$BIN --data-dir $DIR --nats-listen 127.0.0.1:14222 --http-addr 127.0.0.1:18080 --reaper-schedule "@every 1h" > $DIR/log 2>&1 &
PID=$!
for i in $(seq 1 100); do curl -sf localhost:18080/readyz >/dev/null && break; sleep 0.1; done
res() { sleep 1.5; $NATS stream get TELHA_RES -S "telha.res.$1" --json 2>/dev/null | python3 -c 'import json,sys,base64; print(base64.b64decode(json.load(sys.stdin)["data"]).decode()[:400])'; }
count() { # count(stream, needle): messages of stream whose data contains needle
  n=$($NATS stream info $1 --json 2>/dev/null | python3 -c 'import json,sys; s=json.load(sys.stdin)["state"]; print(s["first_seq"], s["last_seq"], s["messages"])')
  set -- $1 "$2" $n; c=0
  if [ "${5:-0}" != 0 ]; then for q in $(seq $3 $4); do $NATS stream get $1 $q --json 2>/dev/null | python3 -c 'import json,sys,base64; print(base64.b64decode(json.load(sys.stdin)["data"]).decode(errors="replace"))' | grep -q -- "$2" && c=$((c+1)); done; fi
  echo $c; }
echo "## 1. a ~1 MiB invalid request"
head -c 1048300 /dev/zero | tr '\0' 'a' | sed 's/^/{"request_id":"big-1","op":"put_node","tenant":"big","id":"not-a-uuid","props":{"x":"/; s/$/"}}/' > $DIR/big.json
$NATS pub telha.req.big -H Nats-Msg-Id:big.big-1 "$(cat $DIR/big.json)" >/dev/null 2>&1 || $NATS pub telha.req.big -H Nats-Msg-Id:big.big-1 < $DIR/big.json >/dev/null 2>&1
sleep 3
echo "result: $(res big)"
echo "TELHA_DLQ messages: $($NATS stream info TELHA_DLQ --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"]["messages"])')"
echo "worker log lines 'dead letter not stored': $(grep -c 'dead letter not stored' $DIR/log)"
echo "## 2. dup-2 as put_node of X, then as tombstone_node of Y"
X=11111111-1111-4111-8111-111111111111; Y=22222222-2222-4222-8222-222222222222
$NATS pub telha.req.cf -H Nats-Msg-Id:cf.y "{\"request_id\":\"y\",\"op\":\"put_node\",\"tenant\":\"cf\",\"id\":\"$Y\"}" >/dev/null 2>&1
$NATS pub telha.req.cf -H Nats-Msg-Id:cf.dup-2.a "{\"request_id\":\"dup-2\",\"op\":\"put_node\",\"tenant\":\"cf\",\"id\":\"$X\"}" >/dev/null 2>&1
sleep 1
$NATS pub telha.req.cf -H Nats-Msg-Id:cf.dup-2.b "{\"request_id\":\"dup-2\",\"op\":\"tombstone_node\",\"tenant\":\"cf\",\"id\":\"$Y\"}" >/dev/null 2>&1
echo "second result: $(res cf)"
echo "GET node Y: $(curl -s -o /dev/null -w '%{http_code}' localhost:18080/v1/tenants/cf/nodes/$Y)"
echo "## 3. the same request id in tenants a and b (each with Nats-Msg-Id <tenant>.<id>, as the client now does)"
for t in a b; do $NATS pub telha.req.$t -H Nats-Msg-Id:$t.order-1 "{\"request_id\":\"order-1\",\"op\":\"put_node\",\"tenant\":\"$t\",\"id\":\"$X\"}" >/dev/null 2>&1; done
sleep 2
echo "TELHA_RES results for order-1: $(count TELHA_RES '"order-1"')"
echo "GET node X in b: $(curl -s -o /dev/null -w '%{http_code}' localhost:18080/v1/tenants/b/nodes/$X)"
echo "## 4. an undecodable body, published with Nats-Msg-Id pub-42"
$NATS pub telha.req.und -H Nats-Msg-Id:pub-42 '[1,2,3]' >/dev/null 2>&1
echo "result: $(res und)"
echo "## 5. a put_edge changing an edge's endpoints (invalid when applied)"
Z=33333333-3333-4333-8333-333333333333; E=44444444-4444-4444-8444-444444444444
for n in $X $Y $Z; do $NATS pub telha.req.ai -H Nats-Msg-Id:ai.n-$n "{\"request_id\":\"n-$n\",\"op\":\"put_node\",\"tenant\":\"ai\",\"id\":\"$n\"}" >/dev/null 2>&1; done
$NATS pub telha.req.ai -H Nats-Msg-Id:ai.e1 "{\"request_id\":\"e1\",\"op\":\"put_edge\",\"tenant\":\"ai\",\"id\":\"$E\",\"src\":\"$X\",\"dst\":\"$Y\"}" >/dev/null 2>&1
sleep 1
$NATS pub telha.req.ai -H Nats-Msg-Id:ai.e2 "{\"request_id\":\"e2\",\"op\":\"put_edge\",\"tenant\":\"ai\",\"id\":\"$E\",\"src\":\"$X\",\"dst\":\"$Z\"}" >/dev/null 2>&1
echo "result: $(res ai)"
echo "dead letters of edge $E: $(count TELHA_DLQ "$E")"
echo "## 6. error texts"
$NATS pub telha.req.et -H Nats-Msg-Id:et.e1 '{"request_id":"et-1","op":"put_node","tenant":"et","id":[1]}' >/dev/null 2>&1
echo "wrong type: $(res et | python3 -c 'import json,sys; print(json.load(sys.stdin)["error"])' 2>/dev/null)"
$NATS pub telha.req.et -H Nats-Msg-Id:et.e2 "{\"request_id\":\"et-2\",\"op\":\"tombstone_node\",\"tenant\":\"et\",\"id\":\"$X\",\"valid_end\":\"tomorrow\"}" >/dev/null 2>&1
echo "bad time: $(res et | python3 -c 'import json,sys; print(json.load(sys.stdin)["error"])' 2>/dev/null)"
kill $PID; wait $PID 2>/dev/null; rm -rf $DIR
