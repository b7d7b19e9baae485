package chartcheck

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

var requiredLabels = []string{
	"app.kubernetes.io/name",
	"app.kubernetes.io/instance",
	"app.kubernetes.io/version",
	"app.kubernetes.io/component",
	"app.kubernetes.io/managed-by",
	"app.kubernetes.io/part-of",
}

// podNameLabel is the label the StatefulSet controller puts on each pod
// (its name).
const podNameLabel = "statefulset.kubernetes.io/pod-name"

// versionLabelKeys may never appear in a selector: a selector must not
// change when the chart or the app is upgraded.
var versionLabelKeys = []string{"app.kubernetes.io/version", "helm.sh/chart"}

type chartMeta struct {
	Version    string `json:"version"`
	AppVersion string `json:"appVersion"`
}

func readChartMeta(t *testing.T) chartMeta {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var m chartMeta
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestStrictDecoderRejectsBadFields makes sure the decoder used for the
// renders really is strict, including for wrong-case field names and for
// the monitoring types.
func TestStrictDecoderRejectsBadFields(t *testing.T) {
	dec := strictDecoder(t)
	bad := map[string]string{
		"unknown field":         "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: x}\nspec:\n  replicas: 1\n  bogus: 1\n",
		"wrong case":            "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: x}\nspec:\n  Replicas: 1\n",
		"duplicate":             "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  type: ClusterIP\n  type: ClusterIP\n",
		"nested unknown":        "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n  - name: c\n    image: i\n    securityContext: {readOnlyRootFS: true}\n",
		"monitoring unknown":    "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: x}\nspec:\n  groups:\n  - name: g\n    rules:\n    - alert: A\n      expr: up\n      severity: x\n",
		"monitoring wrong case": "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: x}\nspec:\n  Endpoints: []\n  selector: {}\n",
		"unknown kind":          "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: x}\n",
	}
	for name, doc := range bad {
		if _, _, err := dec.Decode([]byte(doc), nil, nil); err == nil {
			t.Errorf("%s: strict decoder accepted:\n%s", name, doc)
		}
	}
	good := "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: x}\nspec:\n  endpoints: [{port: http}]\n  selector: {}\n"
	if _, _, err := dec.Decode([]byte(good), nil, nil); err != nil {
		t.Errorf("strict decoder rejected a valid ServiceMonitor: %v", err)
	}
}

func TestRendersDecodeStrictly(t *testing.T) {
	rs := allRenders(t)
	if len(rs) < 3 {
		t.Fatalf("want the default render and at least two ci renders, got %d", len(rs))
	}
	for _, r := range rs {
		kinds := map[string]int{}
		for _, o := range r.objects {
			kinds[fmt.Sprintf("%T", o)]++
		}
		t.Logf("%s: %d objects %v", r.name, len(r.objects), kinds)
	}
}

func TestLabelsAndSelectors(t *testing.T) {
	meta := readChartMeta(t)
	for _, r := range allRenders(t) {
		t.Run(r.name, func(t *testing.T) {
			for _, o := range r.objects {
				acc, err := metaOf(o)
				if err != nil {
					t.Fatal(err)
				}
				what := fmt.Sprintf("%T %s", o, acc.GetName())
				for _, k := range requiredLabels {
					if acc.GetLabels()[k] == "" {
						t.Errorf("%s: missing label %s", what, k)
					}
				}
				if acc.GetNamespace() == "" {
					t.Errorf("%s: no namespace", what)
				}
				for _, sel := range selectorsOf(o) {
					for _, k := range versionLabelKeys {
						if _, ok := sel.labels[k]; ok {
							t.Errorf("%s: selector %s carries version label %s", what, sel.where, k)
						}
					}
					for k, v := range sel.labels {
						if strings.Contains(v, meta.Version) || (meta.AppVersion != "" && strings.Contains(v, meta.AppVersion)) {
							t.Errorf("%s: selector %s label %s=%q contains a version", what, sel.where, k, v)
						}
					}
				}
			}

			sts := oneOf[*appsv1.StatefulSet](t, r)
			podLabels := sts.Spec.Template.Labels
			if !subset(sts.Spec.Selector.MatchLabels, podLabels) {
				t.Errorf("StatefulSet selector %v does not match its pod labels %v", sts.Spec.Selector.MatchLabels, podLabels)
			}
			for _, svc := range objectsOf[*corev1.Service](r) {
				sel := maps.Clone(svc.Spec.Selector)
				// A per-replica Service (the Ingress's) also selects one pod
				// by the name the StatefulSet controller labels it with.
				if pod, ok := sel[podNameLabel]; ok {
					delete(sel, podNameLabel)
					var i int32
					if _, err := fmt.Sscanf(pod, sts.Name+"-%d", &i); err != nil || pod != fmt.Sprintf("%s-%d", sts.Name, i) || i >= *sts.Spec.Replicas {
						t.Errorf("Service %s selects pod %q, which the StatefulSet does not have", svc.Name, pod)
					}
				}
				if len(sel) == 0 || !subset(sel, podLabels) {
					t.Errorf("Service %s selector %v does not select the worker pods", svc.Name, svc.Spec.Selector)
				}
			}
			for _, pdb := range objectsOf[*policyv1.PodDisruptionBudget](r) {
				if !subset(pdb.Spec.Selector.MatchLabels, podLabels) {
					t.Errorf("PDB selector does not select the worker pods")
				}
			}
			for _, np := range objectsOf[*networkingv1.NetworkPolicy](r) {
				if !subset(np.Spec.PodSelector.MatchLabels, podLabels) {
					t.Errorf("NetworkPolicy podSelector does not select the worker pods")
				}
			}
			// The helm test pod must not be selected by the worker selectors.
			for _, p := range objectsOf[*corev1.Pod](r) {
				if subset(sts.Spec.Selector.MatchLabels, p.Labels) {
					t.Errorf("test pod %s matches the StatefulSet selector", p.Name)
				}
			}
		})
	}
}

type selector struct {
	where  string
	labels map[string]string
}

func labelSelectorLabels(where string, ls *metav1.LabelSelector) []selector {
	if ls == nil {
		return nil
	}
	out := []selector{{where, ls.MatchLabels}}
	m := map[string]string{}
	for _, e := range ls.MatchExpressions {
		m[e.Key] = strings.Join(e.Values, ",")
	}
	return append(out, selector{where + ".matchExpressions", m})
}

func selectorsOf(o runtime.Object) []selector {
	var out []selector
	switch v := o.(type) {
	case *appsv1.StatefulSet:
		out = append(out, labelSelectorLabels("spec.selector", v.Spec.Selector)...)
		for _, vct := range v.Spec.VolumeClaimTemplates {
			// volumeClaimTemplates are immutable: their labels behave like a selector.
			out = append(out, selector{"volumeClaimTemplates." + vct.Name + ".labels", vct.Labels})
		}
		if a := v.Spec.Template.Spec.Affinity; a != nil {
			for _, pa := range []*corev1.PodAntiAffinity{a.PodAntiAffinity} {
				if pa == nil {
					continue
				}
				for i, term := range pa.PreferredDuringSchedulingIgnoredDuringExecution {
					out = append(out, labelSelectorLabels(fmt.Sprintf("podAntiAffinity.preferred[%d]", i), term.PodAffinityTerm.LabelSelector)...)
				}
				for i, term := range pa.RequiredDuringSchedulingIgnoredDuringExecution {
					out = append(out, labelSelectorLabels(fmt.Sprintf("podAntiAffinity.required[%d]", i), term.LabelSelector)...)
				}
			}
		}
		for i, c := range v.Spec.Template.Spec.TopologySpreadConstraints {
			out = append(out, labelSelectorLabels(fmt.Sprintf("topologySpreadConstraints[%d]", i), c.LabelSelector)...)
		}
	case *corev1.Service:
		out = append(out, selector{"spec.selector", v.Spec.Selector})
	case *policyv1.PodDisruptionBudget:
		out = append(out, labelSelectorLabels("spec.selector", v.Spec.Selector)...)
	case *networkingv1.NetworkPolicy:
		out = append(out, labelSelectorLabels("spec.podSelector", &v.Spec.PodSelector)...)
		for i, rule := range v.Spec.Ingress {
			for j, peer := range rule.From {
				out = append(out, labelSelectorLabels(fmt.Sprintf("ingress[%d].from[%d].podSelector", i, j), peer.PodSelector)...)
			}
		}
	case *monitoringv1.ServiceMonitor:
		out = append(out, labelSelectorLabels("spec.selector", &v.Spec.Selector)...)
	}
	return out
}

func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func metaOf(o runtime.Object) (metav1.Object, error) {
	acc, ok := o.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no object metadata", o)
	}
	return acc, nil
}

func TestSecurityDefaults(t *testing.T) {
	for _, r := range allRenders(t) {
		t.Run(r.name, func(t *testing.T) {
			sts := oneOf[*appsv1.StatefulSet](t, r)
			checkPodSecurity(t, "StatefulSet "+sts.Name, &sts.Spec.Template.Spec)
			spec := sts.Spec.Template.Spec
			if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
				t.Errorf("worker pods should not mount a service account token")
			}
			if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
				t.Errorf("enableServiceLinks must be false (service env vars could shadow TELHA_* flags)")
			}
			if sc := spec.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser == 0 || sc.FSGroup == nil {
				t.Errorf("pod must run as a non-zero uid with an fsGroup for the data volume")
			}
			pods := objectsOf[*corev1.Pod](r)
			if len(pods) != 1 {
				t.Fatalf("want one helm test pod, got %d", len(pods))
			}
			checkPodSecurity(t, "test pod "+pods[0].Name, &pods[0].Spec)
		})
	}
}

func checkPodSecurity(t *testing.T, what string, spec *corev1.PodSpec) {
	t.Helper()
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Errorf("%s: pod securityContext.runAsNonRoot must be true", what)
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: pod seccompProfile must be RuntimeDefault", what)
	}
	all := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
	for _, c := range all {
		sc := c.SecurityContext
		if sc == nil {
			t.Errorf("%s/%s: no securityContext", what, c.Name)
			continue
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s/%s: readOnlyRootFilesystem must be true", what, c.Name)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s/%s: allowPrivilegeEscalation must be false", what, c.Name)
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Errorf("%s/%s: privileged", what, c.Name)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
			t.Errorf("%s/%s: capabilities must drop ALL and add none", what, c.Name)
		}
		if sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot {
			t.Errorf("%s/%s: runAsNonRoot overridden to false", what, c.Name)
		}
		if sc.SeccompProfile != nil && sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s/%s: seccompProfile overridden", what, c.Name)
		}
	}
}

func argValue(args []string, flag string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, true
		}
	}
	return "", false
}

func TestStatefulSet(t *testing.T) {
	for _, r := range allRenders(t) {
		t.Run(r.name, func(t *testing.T) {
			sts := oneOf[*appsv1.StatefulSet](t, r)
			if sts.Spec.Replicas == nil {
				t.Fatal("replicas unset")
			}
			n := *sts.Spec.Replicas
			if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
				t.Errorf("podManagementPolicy = %q, want Parallel", sts.Spec.PodManagementPolicy)
			}
			spec := sts.Spec.Template.Spec
			if len(spec.Containers) != 1 {
				t.Fatalf("want one container, got %d", len(spec.Containers))
			}
			c := spec.Containers[0]
			// Access control: tokens from the Secret when one is named, else
			// the worker's loopback-only default (never --auth=off unasked).
			tokFile, hasTok := argValue(c.Args, "--auth-tokens-file")
			authOff := stringValue(valuesOf(t, r), "auth.mode") == "off"
			if mode, set := argValue(c.Args, "--auth"); set != authOff || (set && mode != "off") {
				t.Errorf("--auth=%q (set %v) with auth.mode off %v: want --auth=off exactly then", mode, set, authOff)
			}
			tokSecret := stringValue(valuesOf(t, r), "auth.tokensSecret")
			if hasTok != (tokSecret != "") {
				t.Errorf("--auth-tokens-file = %q (set %v); want it exactly when auth.tokensSecret is set", tokFile, hasTok)
			}
			if hasTok {
				mounted := false
				for _, m := range c.VolumeMounts {
					mounted = mounted || (m.Name == "auth-tokens" && strings.HasPrefix(tokFile, m.MountPath+"/") && m.ReadOnly)
				}
				found := false
				for _, v := range spec.Volumes {
					found = found || (v.Name == "auth-tokens" && v.Secret != nil && v.Secret.SecretName == tokSecret)
				}
				if !mounted || !found {
					t.Errorf("tokens file %s: mounted %v, Secret volume %v", tokFile, mounted, found)
				}
			}
			// Ownership: dynamic/<slots> (the default), or static auto/<N>.
			v := valuesOf(t, r)
			wantOwner := fmt.Sprintf("auto/%d", n)
			if dynamicRender(v) {
				slots := 8
				if s := intValue(v, "ownership.slots"); s != 0 {
					slots = s
				}
				if int(n) > slots {
					t.Errorf("%d replicas for %d slots", n, slots)
				}
				wantOwner = fmt.Sprintf("dynamic/%d", slots)
			}
			if got, _ := argValue(c.Args, "--partition-owner"); got != wantOwner {
				t.Errorf("--partition-owner = %q, want %s", got, wantOwner)
			}
			p, ok := argValue(c.Args, "--partitions")
			if !ok {
				t.Errorf("--partitions missing")
			}
			var pn int32
			if _, err := fmt.Sscan(p, &pn); err != nil || pn < n {
				t.Errorf("--partitions = %q, want an integer >= replicas %d", p, n)
			}
			if sts.Annotations["telha.io/partitions"] != p {
				t.Errorf("annotation telha.io/partitions = %q, want %q", sts.Annotations["telha.io/partitions"], p)
			}
			if u, _ := argValue(c.Args, "--nats-url"); u == "" {
				t.Errorf("--nats-url must be set (never the embedded server in Kubernetes)")
			}
			if d, _ := argValue(c.Args, "--data-dir"); d != "/data" {
				t.Errorf("--data-dir = %q, want /data", d)
			}
			for _, f := range []string{"--http-addr", "--max-batch-ops", "--reaper-schedule", "--log-format"} {
				if _, ok := argValue(c.Args, f); !ok {
					t.Errorf("%s missing", f)
				}
			}
			for _, e := range c.Env {
				if e.Name == "TELHA_NATS_PASSWORD" && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
					t.Errorf("the NATS password must come from a Secret")
				}
			}
			for _, a := range c.Args {
				if strings.HasPrefix(a, "--nats-password") {
					t.Errorf("password passed as an argument")
				}
			}
			// Volumes: one PVC per replica for the Pebble directory.
			if len(sts.Spec.VolumeClaimTemplates) != 1 || sts.Spec.VolumeClaimTemplates[0].Name != "data" {
				t.Fatalf("want one volumeClaimTemplate named data")
			}
			mounted := false
			for _, m := range c.VolumeMounts {
				if m.Name == "data" && m.MountPath == "/data" {
					mounted = true
				}
			}
			if !mounted {
				t.Errorf("data volume not mounted at /data")
			}
			// Probes.
			checkProbe(t, "liveness", c.LivenessProbe, "/healthz")
			checkProbe(t, "readiness", c.ReadinessProbe, "/readyz")
			if c.StartupProbe != nil {
				checkProbe(t, "startup", c.StartupProbe, "/healthz")
			}
			// The http port (and the api port, checked in TestAPIPort).
			port := int32(8080)
			if p := intValue(v, "service.port"); p != 0 {
				port = int32(p)
			}
			if len(c.Ports) == 0 || c.Ports[0].Name != "http" || c.Ports[0].ContainerPort != port {
				t.Errorf("want container port http/%d first, got %+v", port, c.Ports)
			}
			if spec.TerminationGracePeriodSeconds == nil || *spec.TerminationGracePeriodSeconds < 60 {
				t.Errorf("terminationGracePeriodSeconds too short for the SIGTERM drain")
			}
			// Headless service.
			var headless *corev1.Service
			for _, s := range objectsOf[*corev1.Service](r) {
				if s.Name == sts.Spec.ServiceName {
					headless = s
				}
			}
			if headless == nil || headless.Spec.ClusterIP != corev1.ClusterIPNone {
				t.Errorf("serviceName %q is not a headless Service of the release", sts.Spec.ServiceName)
			}
			if r.name == "three-replicas" {
				if n != 3 {
					t.Errorf("three-replicas render has %d replicas", n)
				}
				if got, _ := argValue(c.Args, "--partition-owner"); got != "dynamic/8" {
					t.Errorf("three-replicas: --partition-owner = %q, want dynamic/8", got)
				}
			}
		})
	}
}

// dynamicRender reports whether a render's values (nil: the chart's
// defaults) run ownership.mode dynamic, the default.
func dynamicRender(v map[string]any) bool {
	m := stringValue(v, "ownership.mode")
	return m == "" || m == "dynamic"
}

func checkProbe(t *testing.T, name string, p *corev1.Probe, path string) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Errorf("%s probe: missing or not httpGet", name)
		return
	}
	if p.HTTPGet.Path != path || p.HTTPGet.Port.String() != "http" {
		t.Errorf("%s probe: %s on port %s, want %s on http", name, p.HTTPGet.Path, p.HTTPGet.Port.String(), path)
	}
}

func TestOptionalObjects(t *testing.T) {
	def := renderByName(t, "chart-defaults")
	if n := len(objectsOf[*monitoringv1.ServiceMonitor](def)); n != 0 {
		t.Errorf("default render has %d ServiceMonitors; they need CRDs and must be off by default", n)
	}
	if n := len(objectsOf[*monitoringv1.PrometheusRule](def)); n != 0 {
		t.Errorf("default render has %d PrometheusRules; they need CRDs and must be off by default", n)
	}
	if n := len(objectsOf[*policyv1.PodDisruptionBudget](def)); n != 1 {
		t.Errorf("default render: want a PodDisruptionBudget, got %d", n)
	}
	if n := len(objectsOf[*corev1.ServiceAccount](def)); n != 1 {
		t.Errorf("default render: want a ServiceAccount, got %d", n)
	}

	three := renderByName(t, "three-replicas")
	for _, kind := range []string{"ServiceMonitor", "PrometheusRule", "NetworkPolicy", "PodDisruptionBudget", "dashboard ConfigMap"} {
		var n int
		switch kind {
		case "ServiceMonitor":
			n = len(objectsOf[*monitoringv1.ServiceMonitor](three))
		case "PrometheusRule":
			n = len(objectsOf[*monitoringv1.PrometheusRule](three))
		case "NetworkPolicy":
			n = len(objectsOf[*networkingv1.NetworkPolicy](three))
		case "PodDisruptionBudget":
			n = len(objectsOf[*policyv1.PodDisruptionBudget](three))
		case "dashboard ConfigMap":
			n = len(dashboardConfigMaps(three))
		}
		if n != 1 {
			t.Errorf("three-replicas render: want one %s, got %d", kind, n)
		}
	}
	sts := oneOf[*appsv1.StatefulSet](t, three)
	c := sts.Spec.Template.Spec.Containers[0]
	for _, f := range []string{"--nats-creds", "--nats-tls-ca", "--nats-tls-cert", "--nats-tls-key"} {
		path, ok := argValue(c.Args, f)
		if !ok {
			t.Errorf("three-replicas: %s missing", f)
			continue
		}
		if !mountedPath(c, path) {
			t.Errorf("three-replicas: %s=%s is not on a mounted volume", f, path)
		}
	}
}

func mountedPath(c corev1.Container, path string) bool {
	for _, m := range c.VolumeMounts {
		if strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
			return true
		}
	}
	return false
}

func TestServiceMonitorAndNetworkPolicy(t *testing.T) {
	for _, r := range allRenders(t) {
		t.Run(r.name, func(t *testing.T) {
			svcs := objectsOf[*corev1.Service](r)
			for _, sm := range objectsOf[*monitoringv1.ServiceMonitor](r) {
				var matched []*corev1.Service
				for _, s := range svcs {
					if subset(sm.Spec.Selector.MatchLabels, s.Labels) {
						matched = append(matched, s)
					}
				}
				if len(matched) != 1 {
					t.Fatalf("ServiceMonitor selects %d Services, want exactly 1 (no double scrape)", len(matched))
				}
				for _, ep := range sm.Spec.Endpoints {
					found := false
					for _, p := range matched[0].Spec.Ports {
						if p.Name == ep.Port {
							found = true
						}
					}
					if !found || ep.Path != "/metrics" {
						t.Errorf("ServiceMonitor endpoint port=%q path=%q does not match the Service", ep.Port, ep.Path)
					}
				}
			}
			for _, np := range objectsOf[*networkingv1.NetworkPolicy](r) {
				if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
					t.Errorf("NetworkPolicy must restrict ingress and egress")
				}
				for _, rule := range np.Spec.Ingress {
					if len(rule.Ports) != 1 || rule.Ports[0].Port == nil || (rule.Ports[0].Port.String() != "http" && rule.Ports[0].Port.String() != "api") {
						t.Errorf("ingress must be limited to the http port (and the api port), got %+v", rule.Ports)
					}
				}
				var dns, nats bool
				for _, rule := range np.Spec.Egress {
					for _, p := range rule.Ports {
						if p.Port != nil && p.Port.IntValue() == 53 {
							dns = true
						}
						if p.Port != nil && p.Port.IntValue() == 4222 {
							nats = true
						}
					}
				}
				if !dns || !nats {
					t.Errorf("egress must allow DNS (%v) and NATS (%v)", dns, nats)
				}
			}
		})
	}
}

// --- alerts ---------------------------------------------------------------

var requiredAlerts = []string{
	"TelhaWorkerDown",
	"TelhaJournalStuck",
	"TelhaReaperNotSucceeding",
	"TelhaDeadLettersIncreasing",
	"TelhaDeadLetterFailures",
	"TelhaConsumerBacklogGrowing",
	"TelhaRedeliveriesHigh",
	"TelhaPebbleWriteStalls",
	"TelhaPoisonJournals",
	"TelhaDeadLetterResultFailures",
	"TelhaOldestRequestWaiting",
	"TelhaResultsParked",
	"TelhaChangeFeedLagging",
}

// dynamicAlerts read the families only a dynamic member exports
// (telha_partition_*): rendered with ownership.mode dynamic only.
var dynamicAlerts = []string{
	"TelhaSlotWithoutOwner",
	"TelhaStandbyLagging",
}

func TestPrometheusRules(t *testing.T) {
	anchors := runbookAnchors(t)
	staticChecked := 0
	for _, r := range allRenders(t) {
		dynamic := dynamicRender(valuesOf(t, r))
		for _, pr := range objectsOf[*monitoringv1.PrometheusRule](r) {
			if !dynamic {
				staticChecked++
			}
			t.Run(r.name, func(t *testing.T) {
				seen := map[string]bool{}
				for _, g := range pr.Spec.Groups {
					for _, rule := range g.Rules {
						name := rule.Alert
						if name == "" {
							name = rule.Record
						}
						expr := rule.Expr.String()
						names, err := parsePromQL(expr)
						if err != nil {
							t.Errorf("%s: expr does not parse: %v\n%s", name, err, expr)
							continue
						}
						for _, m := range names {
							if !knownMetric(m) {
								t.Errorf("%s: unknown metric %q", name, m)
							}
						}
						if rule.Alert == "" {
							continue
						}
						seen[rule.Alert] = true
						if rule.For != nil {
							if _, err := model.ParseDuration(string(*rule.For)); err != nil {
								t.Errorf("%s: for: %v", name, err)
							}
						}
						if rule.Labels["severity"] == "" {
							t.Errorf("%s: no severity label", name)
						}
						for _, a := range []string{"summary", "description", "runbook_url"} {
							if strings.TrimSpace(rule.Annotations[a]) == "" {
								t.Errorf("%s: no %s annotation", name, a)
							}
						}
						u := rule.Annotations["runbook_url"]
						base, anchor, ok := strings.Cut(u, "#")
						if !ok || !strings.HasSuffix(base, "docs/RUNBOOK.md") {
							t.Errorf("%s: runbook_url %q does not point into docs/RUNBOOK.md", name, u)
						} else if !anchors[anchor] {
							t.Errorf("%s: runbook anchor #%s is not a heading of docs/RUNBOOK.md", name, anchor)
						} else if anchor != strings.ToLower(rule.Alert) {
							t.Errorf("%s: runbook anchor #%s, want the alert's own section #%s", name, anchor, strings.ToLower(rule.Alert))
						}
						if !strings.Contains(expr, `namespace="`) && !strings.Contains(expr, "namespace=~") {
							t.Logf("%s: expression is not scoped to a namespace: %s", name, expr)
						}
					}
				}
				if r.name == "three-replicas" {
					if !dynamic {
						t.Errorf("three-replicas render is not dynamic: its dynamic-mode alerts go unchecked")
					}
					for _, a := range append(slices.Clone(requiredAlerts), dynamicAlerts...) {
						if !seen[a] {
							t.Errorf("alert %s missing", a)
						}
					}
				}
				if !dynamic {
					for _, a := range dynamicAlerts {
						if seen[a] {
							t.Errorf("alert %s rendered with ownership.mode static (its metrics exist only in dynamic mode)", a)
						}
					}
				}
			})
		}
	}
	if staticChecked == 0 {
		t.Error("no static-mode render has a PrometheusRule: the absence of the dynamic-mode alerts goes unchecked")
	}
	if len(objectsOf[*monitoringv1.PrometheusRule](renderByName(t, "three-replicas"))) != 1 {
		t.Fatal("three-replicas render has no PrometheusRule")
	}
}

// runbookAnchors returns GitHub's anchors for the headings of docs/RUNBOOK.md.
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", "RUNBOOK.md"))
	if err != nil {
		t.Fatalf("docs/RUNBOOK.md: %v", err)
	}
	anchors := map[string]bool{}
	drop := regexp.MustCompile(`[^\p{L}\p{N}\- _]`)
	inFence := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		a := strings.ToLower(h)
		a = drop.ReplaceAllString(a, "")
		a = strings.ReplaceAll(a, " ", "-")
		anchors[a] = true
	}
	return anchors
}

// --- dashboard ------------------------------------------------------------

func dashboardConfigMaps(r *render) []*corev1.ConfigMap {
	var out []*corev1.ConfigMap
	for _, cm := range objectsOf[*corev1.ConfigMap](r) {
		if cm.Labels["grafana_dashboard"] != "" {
			out = append(out, cm)
		}
	}
	return out
}

type dashPanel struct {
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	Targets    []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"`
}

type dashboard struct {
	UID           string      `json:"uid"`
	Title         string      `json:"title"`
	SchemaVersion int         `json:"schemaVersion"`
	Panels        []dashPanel `json:"panels"`
	Templating    struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

func TestDashboard(t *testing.T) {
	file, err := os.ReadFile(filepath.Join(chartDir, "files", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var fromFile any
	if err := json.Unmarshal(file, &fromFile); err != nil {
		t.Fatalf("files/dashboard.json: %v", err)
	}
	checked := 0
	for _, r := range allRenders(t) {
		for _, cm := range dashboardConfigMaps(r) {
			t.Run(r.name, func(t *testing.T) {
				if cm.Labels["grafana_dashboard"] != "1" {
					t.Errorf("grafana_dashboard label = %q, want \"1\"", cm.Labels["grafana_dashboard"])
				}
				if len(cm.Data) != 1 {
					t.Fatalf("want one dashboard in the ConfigMap, got %d keys", len(cm.Data))
				}
				for key, body := range cm.Data {
					if !strings.HasSuffix(key, ".json") {
						t.Errorf("key %q should end in .json", key)
					}
					var rendered any
					if err := json.Unmarshal([]byte(body), &rendered); err != nil {
						t.Fatalf("dashboard JSON in the ConfigMap does not parse: %v", err)
					}
					a, _ := json.Marshal(rendered)
					b, _ := json.Marshal(fromFile)
					if string(a) != string(b) {
						t.Errorf("dashboard in the ConfigMap differs from files/dashboard.json")
					}
					checkDashboard(t, []byte(body))
				}
			})
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no render contains the dashboard ConfigMap")
	}
}

func checkDashboard(t *testing.T, body []byte) {
	t.Helper()
	var d dashboard
	if err := json.Unmarshal(body, &d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard needs a uid and a title")
	}
	if d.SchemaVersion < 36 || d.SchemaVersion > 41 {
		t.Errorf("schemaVersion %d, want about 39", d.SchemaVersion)
	}
	hasDS := false
	used := map[string]bool{}
	for _, v := range d.Templating.List {
		if v.Type == "datasource" && v.Name == "datasource" {
			hasDS = true
		}
		if v.Type != "query" {
			continue
		}
		q := string(v.Query)
		var obj struct {
			Query string `json:"query"`
		}
		var s string
		if json.Unmarshal(v.Query, &obj) == nil && obj.Query != "" {
			q = obj.Query
		} else if json.Unmarshal(v.Query, &s) == nil {
			q = s
		}
		m := labelValuesQuery.FindStringSubmatch(q)
		if m == nil || m[2] == "" {
			t.Errorf("variable %s: want label_values(<selector>, <label>), got %q", v.Name, q)
			continue
		}
		names, err := parsePromQL(m[1])
		if err != nil {
			t.Errorf("variable %s: selector %q: %v", v.Name, m[1], err)
		}
		for _, n := range names {
			used[baseMetric(n)] = true
			if !knownMetric(n) {
				t.Errorf("variable %s: unknown metric %q", v.Name, n)
			}
		}
	}
	if !hasDS {
		t.Errorf("dashboard has no datasource template variable named datasource")
	}
	var walk func(ps []dashPanel)
	count := 0
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			count++
			if !strings.Contains(string(p.Datasource), "${datasource}") {
				t.Errorf("panel %q: datasource must be the ${datasource} variable, got %s", p.Title, p.Datasource)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no queries", p.Title)
			}
			for _, tg := range p.Targets {
				names, err := parsePromQL(grafanaToPromQL(tg.Expr))
				if err != nil {
					t.Errorf("panel %q: %v\n%s", p.Title, err, tg.Expr)
					continue
				}
				for _, n := range names {
					used[baseMetric(n)] = true
					if !knownMetric(n) {
						t.Errorf("panel %q: unknown metric %q", p.Title, n)
					}
				}
			}
		}
	}
	walk(d.Panels)
	if count < 10 {
		t.Errorf("dashboard has only %d panels", count)
	}
	// Every worker metric is on the dashboard somewhere.
	for m := range workerMetrics {
		if !used[m] {
			t.Errorf("metric %s is on no dashboard panel", m)
		}
	}
}

func TestPromQLHelpers(t *testing.T) {
	if _, err := parsePromQL("sum(rate(telha_requests_total[5m]) by"); err == nil {
		t.Error("broken PromQL accepted")
	}
	names, err := parsePromQL(`histogram_quantile(0.9, sum by (le) (rate(telha_request_duration_seconds_bucket{pod=~"$pod"}[5m])))`)
	if err != nil || len(names) != 1 || !knownMetric(names[0]) {
		t.Errorf("names=%v err=%v", names, err)
	}
	if knownMetric("telha_requests_bucket") || knownMetric("telha_nope_total") || !knownMetric("go_goroutines") {
		t.Error("knownMetric is wrong")
	}
	if got := grafanaToPromQL("rate(x[$__rate_interval])"); got != "rate(x[5m])" {
		t.Errorf("grafanaToPromQL = %q", got)
	}
}

// --- drift against the worker's source -------------------------------------

// workerSources returns the non-test Go sources under the repository's
// given directories (relative to the repository root), or nil when none
// exist (the chart module checked out alone).
func workerSources(t *testing.T, dirs ...string) string {
	t.Helper()
	var sb strings.Builder
	for _, d := range dirs {
		files, _ := filepath.Glob(filepath.Join("..", d, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			sb.Write(b)
		}
	}
	return sb.String()
}

// TestMetricNamesExistInWorker: every metric the dashboard and the alerts
// may use is one the worker's metrics package registers.
func TestMetricNamesExistInWorker(t *testing.T) {
	src := workerSources(t, "metrics")
	if src == "" {
		t.Skip("no ../metrics sources")
	}
	for m := range workerMetrics {
		if !strings.Contains(src, `"`+m+`"`) {
			t.Errorf("metric %s is not registered in metrics/*.go", m)
		}
	}
}

// TestWorkerMetricsListed: every telha_* family the worker's metrics
// package registers is in workerMetrics, so the dashboard check above
// (every listed metric on a panel) covers it: a new metric cannot be left
// off the dashboard.
func TestWorkerMetricsListed(t *testing.T) {
	src := workerSources(t, "metrics")
	if src == "" {
		t.Skip("no ../metrics sources")
	}
	names := regexp.MustCompile(`"(telha_[a-z0-9_]+)"`).FindAllStringSubmatch(src, -1)
	if len(names) < 20 {
		t.Fatalf("found %d telha_* names in metrics/*.go; the pattern no longer matches", len(names))
	}
	for _, m := range names {
		if _, ok := workerMetrics[m[1]]; !ok {
			t.Errorf("metric %s is registered by the worker but not in workerMetrics (nor, therefore, checked on the dashboard)", m[1])
		}
	}
}

// TestFlagsExistInWorker: every flag the chart passes is one the worker
// defines (an unknown flag makes the worker exit 2 and crash-loop).
func TestFlagsExistInWorker(t *testing.T) {
	src := workerSources(t, "app", "cmd/worker")
	if src == "" {
		t.Skip("no ../app or ../cmd/worker sources")
	}
	flagName := regexp.MustCompile(`^--([a-z0-9][a-z0-9-]*)(=|$)`)
	for _, r := range allRenders(t) {
		sts := oneOf[*appsv1.StatefulSet](t, r)
		for _, a := range sts.Spec.Template.Spec.Containers[0].Args {
			m := flagName.FindStringSubmatch(a)
			if m == nil {
				t.Errorf("%s: argument %q is not a --flag=value", r.name, a)
				continue
			}
			if !strings.Contains(src, `"`+m[1]+`"`) {
				t.Errorf("%s: flag --%s is not defined by the worker", r.name, m[1])
			}
		}
	}
}
