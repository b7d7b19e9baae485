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
//   - the StatefulSet passes --partition-owner auto/<replicas>;
//   - every alert expression and dashboard query parses as PromQL and uses
//     only metric names the worker exports;
//   - values.schema.json rejects unknown keys;
//   - each optional value reaches the objects it should (options_test.go,
//     against ci/ui-ingress-values.yaml, which turns them all on):
//     tracing.otlpEndpoint (--otlp-endpoint), service.apiPort (--api-addr,
//     a named port "api" in the pod and both Services, its own
//     NetworkPolicy rule apart from /metrics), the /ui Ingress (one host
//     and Service per replica when N > 1), extraVolumes/extraVolumeMounts/
//     extraEnv, and what NOTES.txt tells about /ui/ and the tokens;
//   - GOMEMLIMIT from the container's memory limit by default, goMemLimit
//     and an extraEnv GOMEMLIMIT in its place, never twice; the streams'
//     size limits (nats.resultsMaxBytes and the rest) reach the flags
//     (limits_test.go);
//   - every telha_* family the worker's metrics package registers is on
//     the dashboard, and the alerts on the oldest pending request, parked
//     results and dead letters without their result read the right
//     metric with the values' thresholds.
package chartcheck
