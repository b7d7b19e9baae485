package chartcheck

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// workerMetrics are the metric names the worker exports (besides the
// standard go_* and process_* collectors). Histograms also expose their
// _bucket, _sum and _count series.
var workerMetrics = map[string]string{
	"telha_requests_total":                            "counter",
	"telha_request_duration_seconds":                  "histogram",
	"telha_cascades_total":                            "counter",
	"telha_cascade_edges_tombstoned_total":            "counter",
	"telha_journals_inflight":                         "gauge",
	"telha_journal_oldest_age_seconds":                "gauge",
	"telha_journal_chunks_applied_total":              "counter",
	"telha_journals_poison":                           "gauge",
	"telha_reaper_runs_total":                         "counter",
	"telha_reaper_journals_resumed_total":             "counter",
	"telha_reaper_last_success_timestamp_seconds":     "gauge",
	"telha_dead_letters_total":                        "counter",
	"telha_queue_pending_messages":                    "gauge",
	"telha_queue_ack_pending_messages":                "gauge",
	"telha_queue_redelivered_messages":                "gauge",
	"telha_storage_commit_duration_seconds":           "histogram",
	"telha_build_info":                                "gauge",
	"telha_pebble_compaction_debt_bytes":              "gauge",
	"telha_pebble_l0_files":                           "gauge",
	"telha_pebble_l0_sublevels":                       "gauge",
	"telha_pebble_disk_usage_bytes":                   "gauge",
	"telha_pebble_write_stalls_total":                 "counter",
	"telha_pebble_write_stall_duration_seconds_total": "counter",
	"telha_writer_wait_seconds":                       "histogram",
	"telha_writer_task_seconds":                       "histogram",
	"telha_dead_letter_failures_total":                "counter",
	"telha_dead_letter_result_failures_total":         "counter",
	"telha_api_denied_total":                          "counter",
	"telha_request_queue_seconds":                     "histogram",
	"telha_queue_oldest_pending_age_seconds":          "gauge",
	"telha_queue_info_timestamp_seconds":              "gauge",
	"telha_consumer_paused":                           "gauge",
	"telha_results_parked":                            "gauge",
	"telha_results_parked_events_total":               "counter",
	"telha_erase_scrub_seconds":                       "histogram",
	"telha_erase_scrub_writer_held_seconds":           "histogram",
	"telha_erase_scrub_bytes_total":                   "counter",
	"telha_erase_scrub_failures_total":                "counter",
	"telha_changes_published_total":                   "counter",
	"telha_change_feed_failures_total":                "counter",
	"telha_change_feed_reordered_total":               "counter",
	"telha_change_feed_lag_seconds":                   "gauge",
	"telha_storage_commit_failures_total":             "counter",
	"telha_storage_disk_free_bytes":                   "gauge",
	// --partition-owner dynamic: the member's own families.
	"telha_partition_role":                   "gauge",
	"telha_partition_epoch":                  "gauge",
	"telha_partition_applied_sequence":       "gauge",
	"telha_partition_standby_lag":            "gauge",
	"telha_partition_checkpoint_age_seconds": "gauge",
	"telha_partition_start_seconds":          "gauge",
	"telha_member_live_members":              "gauge",
	"telha_partition_moves_total":            "counter",
	"telha_partition_fence_claims_total":     "counter",
	"telha_partition_standby_reads_total":    "counter",
	"telha_member_slow_owner_reads_total":    "counter",
}

// prometheusMetrics are the series Prometheus writes itself for every
// scrape target (TelhaWorkerDown reads up: with no worker up, nothing the
// workers export is there to alert on).
var prometheusMetrics = map[string]bool{
	"up": true,
}

// knownMetric reports whether name is exported by the worker (or written
// by Prometheus for its target).
func knownMetric(name string) bool {
	if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") || prometheusMetrics[name] {
		return true
	}
	if _, ok := workerMetrics[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && workerMetrics[base] == "histogram" {
			return true
		}
	}
	return false
}

// baseMetric maps a histogram series name to its metric name.
func baseMetric(name string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && workerMetrics[base] == "histogram" {
			return base
		}
	}
	return name
}

var promParser = parser.NewParser(parser.Options{})

// parsePromQL parses expr and returns the metric names its selectors use.
// A selector without a metric name (only label matchers) is an error: every
// query must say which metric it reads.
func parsePromQL(expr string) ([]string, error) {
	ast, err := promParser.ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	var selErr error
	parser.Inspect(ast, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		if name == "" {
			for _, m := range vs.LabelMatchers {
				if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
					name = m.Value
				}
			}
		}
		if name == "" {
			selErr = fmt.Errorf("selector %s has no metric name", vs.String())
			return nil
		}
		names[name] = true
		return nil
	})
	if selErr != nil {
		return nil, selErr
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

// grafanaVars replaces Grafana's interval variables, which are not PromQL,
// with a literal duration. Variables inside label-matcher strings
// ("$namespace") are plain strings to the parser and stay.
var grafanaIntervalVar = regexp.MustCompile(`\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}`)

func grafanaToPromQL(expr string) string {
	return grafanaIntervalVar.ReplaceAllString(expr, "5m")
}

// labelValuesQuery matches Grafana's label_values(selector, label) and
// label_values(label) variable queries.
var labelValuesQuery = regexp.MustCompile(`^\s*label_values\(\s*(.*?)\s*(?:,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*)?\)\s*$`)
