package chartcheck

import (
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// The chart's memory and stream-size values: the soft memory limit
// (goMemLimit: TELHA_MEMORY_LIMIT or GOMEMLIMIT), the results and
// dead-letter streams' limits (nats.resultsMaxBytes, nats.dlqMaxBytes,
// nats.resultsMaxPerTenant, nats.dlqMaxPerTenant), and the alerts on the queue's oldest request, parked results and dead
// letters terminated without their result.

// renderWith renders the chart with --set args and returns the worker
// container.
func renderWith(t *testing.T, set ...string) corev1.Container {
	t.Helper()
	var args []string
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, stderr, err := helm(templateArgs(args...)...)
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", set, err, stderr)
	}
	objs, err := decodeAll(strictDecoder(t), out)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if sts, ok := o.(*appsv1.StatefulSet); ok {
			for _, c := range sts.Spec.Template.Spec.Containers {
				if c.Name == "worker" {
					return c
				}
			}
		}
	}
	t.Fatalf("%v: no worker container", set)
	return corev1.Container{}
}

func envNamed(c corev1.Container, name string) []corev1.EnvVar {
	var out []corev1.EnvVar
	for _, e := range c.Env {
		if e.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// TestGoMemLimit: by default (goMemLimit: auto) the chart passes the
// container's memory limit in TELHA_MEMORY_LIMIT (the downward API, in
// bytes), from which the worker sets its soft limit with headroom for
// Pebble's off-heap memory (cmd/worker/memlimit.go), and no GOMEMLIMIT,
// which would be the whole limit; nothing without a memory limit.
// goMemLimit with a size sets GOMEMLIMIT (which the worker keeps), ""
// turns both off; an extraEnv GOMEMLIMIT replaces both, an extraEnv
// TELHA_MEMORY_LIMIT the chart's.
func TestGoMemLimit(t *testing.T) {
	fromLimit := func(t *testing.T, c corev1.Container) {
		t.Helper()
		if env := envNamed(c, "GOMEMLIMIT"); len(env) != 0 {
			t.Errorf("GOMEMLIMIT = %+v with goMemLimit auto: the whole container limit, no room for Pebble's off-heap memory", env)
		}
		env := envNamed(c, "TELHA_MEMORY_LIMIT")
		if len(env) != 1 || env[0].ValueFrom == nil || env[0].ValueFrom.ResourceFieldRef == nil {
			t.Fatalf("TELHA_MEMORY_LIMIT = %+v, want one, from the container's memory limit", env)
		}
		ref := env[0].ValueFrom.ResourceFieldRef
		if ref.Resource != "limits.memory" || (ref.ContainerName != "" && ref.ContainerName != "worker") {
			t.Errorf("TELHA_MEMORY_LIMIT from %+v, want limits.memory of the worker", ref)
		}
		// Bytes, the unitless number the worker reads.
		if ref.Divisor.String() != "1" {
			t.Errorf("TELHA_MEMORY_LIMIT divisor %q, want 1: the worker would read a count of %s as bytes", ref.Divisor.String(), ref.Divisor.String())
		}
	}
	none := func(t *testing.T, c corev1.Container, why string) {
		t.Helper()
		for _, name := range []string{"GOMEMLIMIT", "TELHA_MEMORY_LIMIT"} {
			if env := envNamed(c, name); len(env) != 0 {
				t.Errorf("%s = %+v %s, want none", name, env, why)
			}
		}
	}
	t.Run("default", func(t *testing.T) {
		_, c := worker(t, renderByName(t, "chart-defaults"))
		if c.Resources.Limits.Memory().IsZero() {
			t.Fatal("the chart's default has no memory limit")
		}
		fromLimit(t, c)
	})
	t.Run("no memory limit", func(t *testing.T) {
		c := renderWith(t, "resources.limits=null")
		if !c.Resources.Limits.Memory().IsZero() {
			t.Fatalf("limits %v, want none", c.Resources.Limits)
		}
		none(t, c, "without a memory limit")
	})
	t.Run("other limit", func(t *testing.T) {
		fromLimit(t, renderWith(t, "resources.limits.memory=3Gi"))
	})
	t.Run("explicit value", func(t *testing.T) {
		c := renderWith(t, "goMemLimit=1500MiB")
		env := envNamed(c, "GOMEMLIMIT")
		if len(env) != 1 || env[0].Value != "1500MiB" || env[0].ValueFrom != nil {
			t.Errorf("GOMEMLIMIT = %+v, want 1500MiB", env)
		}
		if env := envNamed(c, "TELHA_MEMORY_LIMIT"); len(env) != 0 {
			t.Errorf("TELHA_MEMORY_LIMIT = %+v beside an explicit GOMEMLIMIT, want none", env)
		}
	})
	t.Run("off", func(t *testing.T) {
		none(t, renderWith(t, "goMemLimit="), "with goMemLimit empty")
	})
	t.Run("extraEnv GOMEMLIMIT wins", func(t *testing.T) {
		c := renderWith(t, "extraEnv[0].name=GOMEMLIMIT,extraEnv[0].value=900MiB")
		env := envNamed(c, "GOMEMLIMIT")
		if len(env) != 1 || env[0].Value != "900MiB" {
			t.Errorf("GOMEMLIMIT = %+v, want extraEnv's 900MiB only", env)
		}
		if env := envNamed(c, "TELHA_MEMORY_LIMIT"); len(env) != 0 {
			t.Errorf("TELHA_MEMORY_LIMIT = %+v beside extraEnv's GOMEMLIMIT, want none", env)
		}
	})
	t.Run("extraEnv TELHA_MEMORY_LIMIT wins", func(t *testing.T) {
		c := renderWith(t, "extraEnv[0].name=TELHA_MEMORY_LIMIT,extraEnv[0].value=1Gi")
		env := envNamed(c, "TELHA_MEMORY_LIMIT")
		if len(env) != 1 || env[0].Value != "1Gi" {
			t.Errorf("TELHA_MEMORY_LIMIT = %+v, want extraEnv's 1Gi only", env)
		}
		if env := envNamed(c, "GOMEMLIMIT"); len(env) != 0 {
			t.Errorf("GOMEMLIMIT = %+v, want none", env)
		}
	})
	// No render has an environment variable twice (the ci files set
	// GOMEMLIMIT through extraEnv).
	for _, r := range allRenders(t) {
		_, c := worker(t, r)
		seen := map[string]bool{}
		for _, e := range c.Env {
			if seen[e.Name] {
				t.Errorf("%s: env %s set twice", r.name, e.Name)
			}
			seen[e.Name] = true
		}
	}
}

// TestStreamLimits: the results and dead-letter streams' limits reach the
// worker's flags, with the worker's own defaults by default.
func TestStreamLimits(t *testing.T) {
	_, c := worker(t, renderByName(t, "chart-defaults"))
	for flag, want := range map[string]string{
		"--results-max-bytes": "1GiB", "--dlq-max-bytes": "1GiB",
		"--results-max-per-tenant": "1000000", "--dlq-max-per-tenant": "10000",
	} {
		if got, ok := argValue(c.Args, flag); !ok || got != want {
			t.Errorf("default %s = %q (set %v), want %q", flag, got, ok, want)
		}
	}
	c = renderWith(t, "nats.resultsMaxBytes=512MiB", "nats.dlqMaxBytes=2GB", "nats.resultsMaxPerTenant=0", "nats.dlqMaxPerTenant=500")
	for flag, want := range map[string]string{
		"--results-max-bytes": "512MiB", "--dlq-max-bytes": "2GB",
		"--results-max-per-tenant": "0", "--dlq-max-per-tenant": "500",
	} {
		if got, ok := argValue(c.Args, flag); !ok || got != want {
			t.Errorf("%s = %q (set %v), want %q", flag, got, ok, want)
		}
	}
	// A large per-tenant count is not printed in floating point.
	c = renderWith(t, "nats.resultsMaxPerTenant=25000000")
	if got, _ := argValue(c.Args, "--results-max-per-tenant"); got != "25000000" {
		t.Errorf("--results-max-per-tenant = %q, want 25000000", got)
	}
}

// TestQueueAndParkedAlerts: the alerts of issue 23 read the right metric
// with the values' thresholds.
func TestQueueAndParkedAlerts(t *testing.T) {
	r := renderByName(t, "three-replicas") // the alerts' defaults
	pr := oneOf[*monitoringv1.PrometheusRule](t, r)
	rules := map[string]monitoringv1.Rule{}
	for _, g := range pr.Spec.Groups {
		for _, rule := range g.Rules {
			rules[rule.Alert] = rule
		}
	}
	for _, tc := range []struct {
		alert, metric, threshold, severity, forDur string
	}{
		{"TelhaOldestRequestWaiting", "telha_queue_oldest_pending_age_seconds", "> 300", "warning", "5m"},
		{"TelhaResultsParked", "telha_results_parked", "> 0", "warning", "1m"},
		{"TelhaDeadLetterResultFailures", "telha_dead_letter_result_failures_total", "> 0", "critical", ""},
	} {
		rule, ok := rules[tc.alert]
		if !ok {
			t.Errorf("alert %s missing", tc.alert)
			continue
		}
		expr := rule.Expr.String()
		names, err := parsePromQL(expr)
		if err != nil || len(names) != 1 || names[0] != tc.metric {
			t.Errorf("%s reads %v (%v), want %s", tc.alert, names, err, tc.metric)
		}
		if !strings.Contains(expr, tc.threshold) || !strings.Contains(expr, `namespace="graph"`) {
			t.Errorf("%s: %s, want %s on the release's series", tc.alert, expr, tc.threshold)
		}
		if rule.Labels["severity"] != tc.severity {
			t.Errorf("%s: severity %q, want %q", tc.alert, rule.Labels["severity"], tc.severity)
		}
		got := ""
		if rule.For != nil {
			got = string(*rule.For)
		}
		if got != tc.forDur {
			t.Errorf("%s: for %q, want %q", tc.alert, got, tc.forDur)
		}
	}
}
