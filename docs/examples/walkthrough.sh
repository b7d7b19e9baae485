#!/usr/bin/env bash
# Runs the README's "Five-minute walkthrough" literally: every ```sh block of
# that section, in order, the first (the worker) in the background, the rest
# in one shell with -eu. Then it checks what a reader is promised:
# the deleted hub reads 404 now and 200 as of $BEFORE, the NATS CLI's request
# has a lookup answer, and the worker stops cleanly on SIGTERM.
#
#   bash docs/examples/walkthrough.sh
#
# The worker's data goes to a temp dir (TELHA_DATA_DIR, which the worker reads
# like every flag); its ports are the README's (4222, 8080), so they must be
# free. CI runs this after the tests.
set -euo pipefail
cd "$(dirname "$0")/../.."

work=$(mktemp -d)
export TELHA_DATA_DIR="$work/data"
export PATH="$(go env GOPATH)/bin:$PATH"
unset TELHA_NATS_URL # the walkthrough is the embedded default

# The section's sh blocks, one file each.
awk -v dir="$work" '
  /^## Five-minute walkthrough/ { in_section = 1; next }
  /^## / && in_section { exit }
  in_section && /^```sh$/ { n++; file = sprintf("%s/block%02d.sh", dir, n); inblock = 1; next }
  inblock && /^```$/ { inblock = 0; close(file); next }
  inblock { print > file }
' README.md
blocks=("$work"/block*.sh)
if [ "${#blocks[@]}" -lt 3 ]; then
  echo "walkthrough: found ${#blocks[@]} sh blocks in the README's walkthrough; expected the worker and at least two more" >&2
  exit 1
fi
if ! grep -q 'go run ./cmd/worker' "${blocks[0]}"; then
  echo "walkthrough: the first block does not start the worker" >&2
  exit 1
fi

# The worker block runs in its own process group (setsid), so that a signal
# reaches `go run` and the worker it started alike.
worker_pid=
cleanup() {
  if [ -n "$worker_pid" ]; then
    kill -KILL -- "-$worker_pid" 2>/dev/null || true
    wait "$worker_pid" 2>/dev/null || true
  fi
  rm -rf "$work" demo.out
}
trap cleanup EXIT

echo "== walkthrough: block 1 (in the background): $(cat "${blocks[0]}")"
go build -o "$work/worker-build-check" ./cmd/worker # compile first, so the wait below is for the worker, not the compiler
for port in 4222 8080; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "walkthrough: port $port is in use; the README's walkthrough needs it free" >&2
    exit 1
  fi
done
setsid bash -e "${blocks[0]}" >"$work/worker.log" 2>&1 &
worker_pid=$!

deadline=$((SECONDS + 120))
until curl -fsS -o /dev/null localhost:8080/readyz 2>/dev/null; do
  if ! kill -0 "$worker_pid" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
    echo "walkthrough: the worker did not become ready; its log:" >&2
    tail -n 40 "$work/worker.log" >&2
    exit 1
  fi
  sleep 0.5 # polling a process's readiness, with a deadline
done

out="$work/out.txt"
: >"$out"
for b in "${blocks[@]:1}"; do
  cat "$b" >>"$work/rest.sh"
done
echo "== walkthrough: the other blocks, in one shell"
sed 's/^/  | /' "$work/rest.sh"
bash -eu "$work/rest.sh" 2>&1 | tee "$out" # no pipefail: a reader's shell has none (curl | head -c)

fail=0
check() { # check DESCRIPTION REGEX
  if ! grep -Eq "$2" "$out"; then
    echo "walkthrough: FAIL: $1 (no line matches /$2/)" >&2
    fail=1
  else
    echo "walkthrough: ok: $1"
  fi
}
check "the demo printed HUB= and BEFORE= lines" '^BEFORE=[0-9]{4}-'
check "the hub delete's result was printed" '"op":"tombstone_node".*"journaled":true'
# A curl with -w ' %{http_code}\n' prints its body (ending in a newline),
# then the status on a line of its own.
check_status() { # check_status DESCRIPTION BODY_REGEX STATUS
  if BODY="$2" WANT=" $3" awk 'prev ~ ENVIRON["BODY"] && $0 == ENVIRON["WANT"] { found = 1 } { prev = $0 } END { exit !found }' "$out"; then
    echo "walkthrough: ok: $1"
  else
    echo "walkthrough: FAIL: $1 (no body matching /$2/ answered$3)" >&2
    fail=1
  fi
}
hub=$(sed -n 's/^HUB=//p' "$out" | head -n 1)
check_status "the deleted hub reads 404" "\"error\":\"node $hub is absent" 404
check_status "the hub reads 200 as of BEFORE" "^\\{\"id\":\"$hub\"" 200
check "the --wait put-node answered ok" '"op":"put_node".*"status":"ok"'
check "the NATS CLI's tombstone has a lookup answer" '"request_id":"req-42".*"state":"answered"'
check "the NATS CLI read the put's result from TELHA_RES" '^\{"request_id":"req-41".*"status":"ok"'

# SIGTERM, as Ctrl-C or Kubernetes would stop it: the worker drains and
# says so, and logs no error.
# The shell that ran the block may end before the worker does: wait for
# every process of the group (go run and the worker) to be gone.
kill -TERM -- "-$worker_pid"
wait "$worker_pid" 2>/dev/null || true
deadline=$((SECONDS + 90))
while kill -0 -- "-$worker_pid" 2>/dev/null; do
  if [ $SECONDS -ge $deadline ]; then
    echo "walkthrough: FAIL: the worker was still running 90 s after SIGTERM" >&2
    kill -KILL -- "-$worker_pid" 2>/dev/null || true
    fail=1
    break
  fi
  sleep 0.2 # polling for processes to exit, with a deadline
done
worker_pid=
if ! grep -q 'shutting down' "$work/worker.log" || grep -q 'level=ERROR' "$work/worker.log"; then
  echo "walkthrough: FAIL: the worker did not stop cleanly on SIGTERM; its log:" >&2
  tail -n 40 "$work/worker.log" >&2
  fail=1
else
  echo "walkthrough: ok: the worker stopped cleanly on SIGTERM"
fi
[ $fail = 0 ] && echo "walkthrough: passed"
exit $fail
