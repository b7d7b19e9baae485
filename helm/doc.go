// Package chartcheck validates the telha-cascade Helm chart offline.
//
// It is a separate Go module (github.com/telha/telha-cascade/helm) so that
// the chart's validation dependencies (Helm, the Kubernetes API types, the
// prometheus-operator types and the PromQL parser) never enter the
// worker's own go.mod. It has no non-test code besides this file; the
// checks live in chart_test.go and run from helm/ci.sh:
//
//   - every rendered object is strictly decoded into the Kubernetes API and
//     prometheus-operator monitoring/v1 types (unknown or wrong-case fields
//     fail);
//   - selectors carry no version labels; the security defaults hold;
//   - ownership (ownership_test.go): by default the StatefulSet passes
//     --partition-owner dynamic/<ownership.slots> with --changelog
//     jetstream, --member-id and --advertise-url from $(POD_NAME) (env
//     from the downward API) under the headless Service, and the values
//     of ownership.* and changelog.*; ownership.mode static passes
//     auto/<replicas> and exactly the earlier arguments (plus the
//     changelog's flags with changelog.enabled); dynamic refuses an API
//     port, more pods than slots, more slots than partitions and several
//     pods without tokens; its NetworkPolicy lets the pods reach each
//     other on the HTTP port (forwarded reads);
//   - the upgrade guards (upgrade_test.go), rendered with Helm's engine
//     against a fake cluster holding an earlier release's StatefulSet
//     (`lookup` sees it; `helm template` never does): partitions and
//     slots fixed, replicaCount fixed in static mode only, no switch from
//     static without the changelog straight to dynamic, back to static
//     only with the changelog and one replica per slot;
//   - every alert expression and dashboard query parses as PromQL and uses
//     only metric names the worker exports (and Prometheus's own up);
//     every alert links its own section of docs/RUNBOOK.md (#<alert name
//     in lower case>);
//   - TelhaWorkerDown and TelhaConsumerBacklogGrowing
//     (worker_alerts_test.go): their expressions with replicaCount, the
//     backlog's window and the values' for/severity; the alert selector
//     is what the chart's ServiceMonitor gives up (job = the one Service
//     it selects, the release's namespace, no relabelling);
//   - the dynamic-mode alerts (dynamic_alerts_test.go):
//     TelhaSlotWithoutOwner and TelhaStandbyLagging with their
//     expressions and values' for/severity/threshold, only with
//     ownership.mode dynamic (static renders have neither, nor any rule
//     on telha_partition_* or telha_member_*);
//   - values.schema.json rejects unknown keys;
//   - each optional value reaches the objects it should (options_test.go,
//     against ci/ui-ingress-values.yaml, which turns them all on):
//     tracing.otlpEndpoint (--otlp-endpoint), service.apiPort (--api-addr,
//     a named port "api" in the pod and both Services, its own
//     NetworkPolicy rule apart from /metrics), the /ui Ingress (one host
//     and Service per replica when N > 1), extraVolumes/extraVolumeMounts/
//     extraEnv, and what NOTES.txt tells about /ui/, the tokens, who the
//     read API answers in each auth mode, the streams the worker
//     provisions, and the default image, which is not published (a
//     warning that says how to build one);
//   - by default TELHA_MEMORY_LIMIT from the container's memory limit (in
//     bytes; the worker derives its soft limit from it with headroom for
//     Pebble) and no GOMEMLIMIT; goMemLimit's size as GOMEMLIMIT, an
//     extraEnv GOMEMLIMIT or TELHA_MEMORY_LIMIT in the chart's place,
//     never twice; the streams' size limits (nats.resultsMaxBytes and the
//     rest) reach the flags (limits_test.go);
//   - every telha_* family the worker's metrics package registers
//     (the dynamic member's telha_partition_* and telha_member_* too) is
//     on the dashboard, and the alerts on the oldest pending request, parked
//     results and dead letters without their result read the right
//     metric with the values' thresholds.
//
// helm/prom/ci.sh (with its helper helm/prom/promcheck) goes further, on
// recorded and live data: promtool check rules and promtool test rules
// (helm/prom/rules_test.yaml) on the rendered rules, then a real
// Prometheus scraping a worker and a dynamic cluster on loopback, where
// every dashboard query and alert expression must match live series and
// the alerts that can be induced fire and resolve.
package chartcheck
