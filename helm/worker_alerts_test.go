package chartcheck

import (
	"fmt"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TelhaWorkerDown (issue 32): the one alert that fires with no worker up.
// The others read series the pods report themselves; this one reads up,
// which Prometheus writes for each target of the chart's ServiceMonitor,
// so its selector must be what that ServiceMonitor produces.

func ruleFor(r monitoringv1.Rule) string {
	if r.For == nil {
		return ""
	}
	return string(*r.For)
}

func workerDownExpr(sel string, replicas int) string {
	return fmt.Sprintf(`max by (namespace, pod) (up{%[1]s}) == 0
or
(count by (namespace) (up{%[1]s}) or 0 * max by (namespace) (absent(up{%[1]s}))) < %[2]d`, sel, replicas)
}

// TestWorkerDownAlert: rendered by default in both ownership modes, with
// the release's selector, replicaCount as the number of targets expected,
// the values' for and severity; enabled=false leaves it out.
func TestWorkerDownAlert(t *testing.T) {
	const runbook = "https://github.com/telha/telha-cascade/blob/main/docs/RUNBOOK.md#telhaworkerdown"
	for _, tc := range []struct {
		name          string
		set           []string
		sel           string
		replicas      int
		severity, dur string
	}{
		{"defaults", nil, defaultSel, 1, "critical", "5m"},
		{"three replicas", []string{"replicaCount=3", "auth.tokensSecret=t"}, defaultSel, 3, "critical", "5m"},
		{"static, two replicas", []string{"ownership.mode=static", "replicaCount=2", "partitions=8"}, defaultSel, 2, "critical", "5m"},
		{"values", []string{
			"replicaCount=3", "auth.tokensSecret=t",
			`prometheusRule.selector=namespace="graph"\,service="telha"`,
			"prometheusRule.alerts.workerDown.for=10m", "prometheusRule.alerts.workerDown.severity=warning",
		}, `namespace="graph",service="telha"`, 3, "warning", "10m"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rules := alertRules(t, renderObjects(t, append([]string{"prometheusRule.enabled=true"}, tc.set...)...))
			rule, ok := rules["TelhaWorkerDown"]
			if !ok {
				t.Fatal("TelhaWorkerDown missing")
			}
			if want := workerDownExpr(tc.sel, tc.replicas); !samePromQL(t, rule.Expr.String(), want) {
				t.Errorf("expr\n%s\nwant\n%s", rule.Expr.String(), want)
			}
			if rule.Labels["severity"] != tc.severity || ruleFor(rule) != tc.dur {
				t.Errorf("severity %q for %q, want %q %q", rule.Labels["severity"], ruleFor(rule), tc.severity, tc.dur)
			}
			if u := rule.Annotations["runbook_url"]; u != runbook {
				t.Errorf("runbook_url %q, want %s", u, runbook)
			}
			// Both cases of the alert explained: a pod down, too few targets.
			for _, a := range []string{"summary", "description"} {
				v := rule.Annotations[a]
				for _, want := range []string{"{{ if $labels.pod }}", "{{ else }}", fmt.Sprintf("of the %d worker pods", tc.replicas)} {
					if !strings.Contains(v, want) {
						t.Errorf("%s %q does not contain %q", a, v, want)
					}
				}
			}
			if d := rule.Annotations["description"]; !strings.Contains(d, "for "+tc.dur) {
				t.Errorf("description %q does not give the for duration %s", d, tc.dur)
			}
		})
	}
	t.Run("disabled", func(t *testing.T) {
		rules := alertRules(t, renderObjects(t, "prometheusRule.enabled=true", "prometheusRule.alerts.workerDown.enabled=false"))
		if _, ok := rules["TelhaWorkerDown"]; ok {
			t.Error("TelhaWorkerDown rendered with workerDown.enabled=false")
		}
		if _, ok := rules["TelhaJournalStuck"]; !ok {
			t.Error("the other alerts went with it")
		}
	})
}

// TestWorkerDownMatchesServiceMonitor: up gets its job, namespace and pod
// from the chart's ServiceMonitor (prometheus-operator: job = the name of
// the Service scraped, unless jobLabel says otherwise; namespace and pod of
// the endpoint). The default alert selector must be exactly that: the
// ServiceMonitor has no jobLabel nor relabelings, watches the release's
// namespace only, and selects exactly one Service, named <fullname>.
func TestWorkerDownMatchesServiceMonitor(t *testing.T) {
	objs := renderObjects(t, "prometheusRule.enabled=true", "serviceMonitor.enabled=true")
	var sms []*monitoringv1.ServiceMonitor
	var svcs []*corev1.Service
	for _, o := range objs {
		switch x := o.(type) {
		case *monitoringv1.ServiceMonitor:
			sms = append(sms, x)
		case *corev1.Service:
			svcs = append(svcs, x)
		}
	}
	if len(sms) != 1 {
		t.Fatalf("want one ServiceMonitor, got %d", len(sms))
	}
	sm := sms[0]
	if sm.Spec.JobLabel != "" {
		t.Errorf("ServiceMonitor jobLabel %q: job would no longer be the Service's name", sm.Spec.JobLabel)
	}
	if got := sm.Spec.NamespaceSelector.MatchNames; len(got) != 1 || got[0] != namespace || sm.Spec.NamespaceSelector.Any {
		t.Errorf("ServiceMonitor namespaceSelector %+v, want the release's namespace %s only", sm.Spec.NamespaceSelector, namespace)
	}
	for _, ep := range sm.Spec.Endpoints {
		if len(ep.RelabelConfigs) > 0 || ep.HonorLabels {
			t.Errorf("ServiceMonitor endpoint %s relabels or honors labels: job, namespace and pod may not be what the alerts select", ep.Port)
		}
	}
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	var scraped []string
	for _, s := range svcs {
		if sel.Matches(labels.Set(s.Labels)) {
			scraped = append(scraped, s.Name)
		}
	}
	if len(scraped) != 1 || scraped[0] != fullname {
		t.Errorf("the ServiceMonitor selects the Services %v, want only %s (job=%q in the alerts)", scraped, fullname, fullname)
	}
	rule := alertRules(t, objs)["TelhaWorkerDown"]
	if !strings.Contains(rule.Expr.String(), fmt.Sprintf(`up{job=%q,namespace=%q}`, fullname, namespace)) {
		t.Errorf("TelhaWorkerDown does not select up{job=%q,namespace=%q}: %s", fullname, namespace, rule.Expr.String())
	}
}

// TestBacklogGrowingAlert: growth is measured over backlogGrowing.window
// (delta, the backlog now against window before) at every evaluation, not
// by a trend over a fixed window that an earlier, drained burst drags
// down (helm/prom/rules_test.yaml has that case).
func TestBacklogGrowingAlert(t *testing.T) {
	for _, tc := range []struct {
		set                 []string
		window, dur, thresh string
	}{
		{nil, "5m", "15m", "1000"},
		{[]string{"prometheusRule.alerts.backlogGrowing.window=10m", "prometheusRule.alerts.backlogGrowing.for=30m",
			"prometheusRule.alerts.backlogGrowing.pendingThreshold=200"}, "10m", "30m", "200"},
	} {
		rules := alertRules(t, renderObjects(t, append([]string{"prometheusRule.enabled=true"}, tc.set...)...))
		rule, ok := rules["TelhaConsumerBacklogGrowing"]
		if !ok {
			t.Fatal("TelhaConsumerBacklogGrowing missing")
		}
		want := fmt.Sprintf(`(max by (namespace, pod) (delta(telha_queue_pending_messages{%[1]s}[%[2]s])) > 0)
and
(max by (namespace, pod) (telha_queue_pending_messages{%[1]s}) > %[3]s)`, defaultSel, tc.window, tc.thresh)
		if !samePromQL(t, rule.Expr.String(), want) {
			t.Errorf("%v: expr\n%s\nwant\n%s", tc.set, rule.Expr.String(), want)
		}
		if ruleFor(rule) != tc.dur {
			t.Errorf("%v: for %q, want %q", tc.set, ruleFor(rule), tc.dur)
		}
		if d := rule.Annotations["description"]; !strings.Contains(d, tc.window+" before") || !strings.Contains(d, "for "+tc.dur) {
			t.Errorf("%v: description %q does not give the window and for", tc.set, d)
		}
	}
}
