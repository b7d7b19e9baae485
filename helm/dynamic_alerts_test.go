package chartcheck

import (
	"fmt"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// The alerts of ownership.mode dynamic (TelhaSlotWithoutOwner,
// TelhaStandbyLagging): they read telha_partition_role and
// telha_partition_standby_lag, which only a dynamic member exports, so a
// static release does not get them.

// alertRules returns the alerting rules of the one PrometheusRule in objs,
// by alert name.
func alertRules(t *testing.T, objs []runtime.Object) map[string]monitoringv1.Rule {
	t.Helper()
	var prs []*monitoringv1.PrometheusRule
	for _, o := range objs {
		if pr, ok := o.(*monitoringv1.PrometheusRule); ok {
			prs = append(prs, pr)
		}
	}
	if len(prs) != 1 {
		t.Fatalf("want one PrometheusRule, got %d", len(prs))
	}
	rules := map[string]monitoringv1.Rule{}
	for _, g := range prs[0].Spec.Groups {
		for _, rule := range g.Rules {
			if rule.Alert != "" {
				rules[rule.Alert] = rule
			}
		}
	}
	return rules
}

// samePromQL reports whether got and want parse to the same expression
// (formatting apart).
func samePromQL(t *testing.T, got, want string) bool {
	t.Helper()
	g, err := promParser.ParseExpr(got)
	if err != nil {
		t.Errorf("expr does not parse: %v\n%s", err, got)
		return false
	}
	w, err := promParser.ParseExpr(want)
	if err != nil {
		t.Fatalf("the test's expected expr does not parse: %v\n%s", err, want)
	}
	return g.String() == w.String()
}

// defaultSel is the chart's alert selector for the test release.
var defaultSel = fmt.Sprintf(`job=%q,namespace=%q`, fullname, namespace)

// TestDynamicAlerts: with ownership.mode dynamic (the default) the two
// alerts are rendered with their expressions, the values' for, severity
// and threshold, the release's selector, the extra labels and their
// runbook sections; each value changes what it should, and enabled=false
// leaves its alert out.
func TestDynamicAlerts(t *testing.T) {
	const runbook = "https://github.com/telha/telha-cascade/blob/main/docs/RUNBOOK.md"
	type want struct {
		expr, severity, forDur, anchor string
	}
	check := func(t *testing.T, rules map[string]monitoringv1.Rule, alert string, w want) {
		t.Helper()
		rule, ok := rules[alert]
		if !ok {
			t.Errorf("alert %s missing", alert)
			return
		}
		if expr := rule.Expr.String(); !samePromQL(t, expr, w.expr) {
			t.Errorf("%s: expr\n%s\nwant\n%s", alert, expr, w.expr)
		}
		if rule.Labels["severity"] != w.severity {
			t.Errorf("%s: severity %q, want %q", alert, rule.Labels["severity"], w.severity)
		}
		if rule.Labels["team"] != "graph" {
			t.Errorf("%s: labels %v, want additionalAlertLabels team=graph", alert, rule.Labels)
		}
		got := ""
		if rule.For != nil {
			got = string(*rule.For)
		}
		if got != w.forDur {
			t.Errorf("%s: for %q, want %q", alert, got, w.forDur)
		}
		if u := rule.Annotations["runbook_url"]; u != runbook+"#"+w.anchor {
			t.Errorf("%s: runbook_url %q, want %s#%s", alert, u, runbook, w.anchor)
		}
		for _, a := range []string{"summary", "description"} {
			if strings.TrimSpace(rule.Annotations[a]) == "" {
				t.Errorf("%s: no %s annotation", alert, a)
			}
		}
	}
	base := []string{"prometheusRule.enabled=true", "prometheusRule.additionalAlertLabels.team=graph"}

	t.Run("defaults", func(t *testing.T) {
		rules := alertRules(t, renderObjects(t, base...))
		check(t, rules, "TelhaSlotWithoutOwner", want{
			expr:     fmt.Sprintf(`sum by (namespace, slot) (telha_partition_role{%s,role="owner"}) == 0`, defaultSel),
			severity: "critical", forDur: "2m", anchor: "telhaslotwithoutowner",
		})
		check(t, rules, "TelhaStandbyLagging", want{
			expr:     fmt.Sprintf(`max by (namespace, pod, slot) (telha_partition_standby_lag{%s}) > 10000`, defaultSel),
			severity: "warning", forDur: "15m", anchor: "telhastandbylagging",
		})
		if d := rules["TelhaStandbyLagging"].Annotations["summary"]; !strings.Contains(d, "10000") {
			t.Errorf("TelhaStandbyLagging: summary %q does not give the threshold", d)
		}
	})

	t.Run("values", func(t *testing.T) {
		rules := alertRules(t, renderObjects(t, append(base,
			`prometheusRule.selector=namespace="graph"\,service="telha"`,
			"prometheusRule.alerts.slotWithoutOwner.for=5m", "prometheusRule.alerts.slotWithoutOwner.severity=warning",
			"prometheusRule.alerts.standbyLagging.threshold=250000", "prometheusRule.alerts.standbyLagging.for=30m",
			"prometheusRule.alerts.standbyLagging.severity=critical",
		)...))
		sel := `namespace="graph",service="telha"`
		check(t, rules, "TelhaSlotWithoutOwner", want{
			expr:     fmt.Sprintf(`sum by (namespace, slot) (telha_partition_role{%s,role="owner"}) == 0`, sel),
			severity: "warning", forDur: "5m", anchor: "telhaslotwithoutowner",
		})
		check(t, rules, "TelhaStandbyLagging", want{
			expr:     fmt.Sprintf(`max by (namespace, pod, slot) (telha_partition_standby_lag{%s}) > 250000`, sel),
			severity: "critical", forDur: "30m", anchor: "telhastandbylagging",
		})
	})

	for _, tc := range []struct{ off, gone, kept string }{
		{"slotWithoutOwner", "TelhaSlotWithoutOwner", "TelhaStandbyLagging"},
		{"standbyLagging", "TelhaStandbyLagging", "TelhaSlotWithoutOwner"},
	} {
		t.Run(tc.off+" disabled", func(t *testing.T) {
			rules := alertRules(t, renderObjects(t, append(base, "prometheusRule.alerts."+tc.off+".enabled=false")...))
			if _, ok := rules[tc.gone]; ok {
				t.Errorf("%s rendered with %s.enabled=false", tc.gone, tc.off)
			}
			if _, ok := rules[tc.kept]; !ok {
				t.Errorf("%s missing with only %s disabled", tc.kept, tc.off)
			}
		})
	}
}

// TestDynamicAlertsAbsentInStatic: ownership.mode static (with or without
// the changelog) renders the other alerts but neither dynamic-mode alert,
// nor any rule on a family only a dynamic member exports.
func TestDynamicAlertsAbsentInStatic(t *testing.T) {
	for _, set := range [][]string{
		{"ownership.mode=static"},
		{"ownership.mode=static", "changelog.enabled=true"},
		{"ownership.mode=static", "replicaCount=2", "partitions=8"},
	} {
		t.Run(strings.Join(set, ","), func(t *testing.T) {
			rules := alertRules(t, renderObjects(t, append([]string{"prometheusRule.enabled=true"}, set...)...))
			for _, a := range requiredAlerts {
				if _, ok := rules[a]; !ok {
					t.Errorf("alert %s missing in static mode", a)
				}
			}
			for _, a := range dynamicAlerts {
				if _, ok := rules[a]; ok {
					t.Errorf("alert %s rendered in static mode", a)
				}
			}
			for name, rule := range rules {
				expr := rule.Expr.String()
				if strings.Contains(expr, "telha_partition_") || strings.Contains(expr, "telha_member_") {
					t.Errorf("%s reads a dynamic member's family in static mode: %s", name, expr)
				}
			}
		})
	}
}
