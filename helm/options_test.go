package chartcheck

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"
)

// The checks of the chart's optional exposure and extension values:
// tracing.otlpEndpoint, service.apiPort (--api-addr), ingress,
// extraVolumes/extraVolumeMounts/extraEnv and the NetworkPolicy's split of
// the metrics port from the API port. Every render is checked against the
// values file it was rendered from (ci/ui-ingress-values.yaml turns all of
// them on), so a value that stops reaching the objects fails here.

// uiIngressRender is the ci render with every option of this file on.
const uiIngressRender = "ui-ingress"

// valuesOf reads the render's values file (nil for the chart defaults).
func valuesOf(t *testing.T, r *render) map[string]any {
	t.Helper()
	if r.values == "" {
		return nil
	}
	b, err := os.ReadFile(r.values)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", r.values, err)
	}
	return m
}

// value returns the value at a dotted path of a values map, or nil.
func value(m map[string]any, path string) any {
	var cur any = m
	for _, k := range strings.Split(path, ".") {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = mm[k]
	}
	return cur
}

func stringValue(m map[string]any, path string) string {
	s, _ := value(m, path).(string)
	return s
}

func intValue(m map[string]any, path string) int {
	f, _ := value(m, path).(float64)
	return int(f)
}

func worker(t *testing.T, r *render) (*appsv1.StatefulSet, corev1.Container) {
	t.Helper()
	sts := oneOf[*appsv1.StatefulSet](t, r)
	for _, c := range sts.Spec.Template.Spec.Containers {
		if c.Name == "worker" {
			return sts, c
		}
	}
	t.Fatalf("%s: no worker container", r.name)
	return nil, corev1.Container{}
}

func containerPort(c corev1.Container, name string) (int32, bool) {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort, true
		}
	}
	return 0, false
}

func servicePort(s *corev1.Service, name string) (corev1.ServicePort, bool) {
	for _, p := range s.Spec.Ports {
		if p.Name == name {
			return p, true
		}
	}
	return corev1.ServicePort{}, false
}

func TestUIIngressRenderExists(t *testing.T) {
	r := renderByName(t, uiIngressRender)
	v := valuesOf(t, r)
	for _, p := range []string{"tracing.otlpEndpoint", "service.apiPort", "ingress.enabled", "extraVolumes", "extraVolumeMounts", "extraEnv", "networkPolicy.ingress.apiFrom", "networkPolicy.otlp.to"} {
		if value(v, p) == nil {
			t.Errorf("%s does not set %s: the render that turns every option on must", r.values, p)
		}
	}
}

// TestOTLPEndpoint: tracing.otlpEndpoint becomes --otlp-endpoint, and no
// flag is passed without it (the worker then reads
// OTEL_EXPORTER_OTLP_ENDPOINT, which extraEnv may set).
func TestOTLPEndpoint(t *testing.T) {
	seen := false
	for _, r := range allRenders(t) {
		t.Run(r.name, func(t *testing.T) {
			want := stringValue(valuesOf(t, r), "tracing.otlpEndpoint")
			_, c := worker(t, r)
			got, ok := argValue(c.Args, "--otlp-endpoint")
			if ok != (want != "") || got != want {
				t.Errorf("--otlp-endpoint = %q (passed %v), want %q", got, ok, want)
			}
			seen = seen || ok
		})
	}
	if !seen {
		t.Error("no render passes --otlp-endpoint")
	}
}

// TestAPIPort: service.apiPort moves /v1 and /ui to their own named port
// (--api-addr), in the container, the Service and the headless Service;
// /metrics, the probes and the ServiceMonitor stay on port http.
func TestAPIPort(t *testing.T) {
	seen := false
	for _, r := range allRenders(t) {
		t.Run(r.name, func(t *testing.T) {
			v := valuesOf(t, r)
			httpPort := int32(8080)
			if p := intValue(v, "service.port"); p != 0 {
				httpPort = int32(p)
			}
			apiPort := int32(intValue(v, "service.apiPort"))
			sts, c := worker(t, r)
			addr, hasAddr := argValue(c.Args, "--api-addr")
			if got, _ := argValue(c.Args, "--http-addr"); got != fmt.Sprintf(":%d", httpPort) {
				t.Errorf("--http-addr = %q, want :%d", got, httpPort)
			}
			if p, ok := containerPort(c, "http"); !ok || p != httpPort {
				t.Errorf("container port http = %d (%v), want %d", p, ok, httpPort)
			}
			p, hasPort := containerPort(c, "api")
			if apiPort == 0 {
				if hasAddr || hasPort || len(c.Ports) != 1 {
					t.Errorf("no apiPort: want no --api-addr (got %q) and only port http (got %+v)", addr, c.Ports)
				}
				return
			}
			seen = true
			if addr != fmt.Sprintf(":%d", apiPort) {
				t.Errorf("--api-addr = %q, want :%d", addr, apiPort)
			}
			if !hasPort || p != apiPort || len(c.Ports) != 2 {
				t.Errorf("container ports %+v, want http/%d and api/%d", c.Ports, httpPort, apiPort)
			}
			for _, pr := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
				if pr != nil && pr.HTTPGet.Port.String() != "http" {
					t.Errorf("probe %s on port %s: the API port serves no health", pr.HTTPGet.Path, pr.HTTPGet.Port.String())
				}
			}
			for _, name := range []string{fullname, sts.Spec.ServiceName} {
				var svc *corev1.Service
				for _, s := range objectsOf[*corev1.Service](r) {
					if s.Name == name {
						svc = s
					}
				}
				if svc == nil {
					t.Fatalf("no Service %s", name)
				}
				sp, ok := servicePort(svc, "api")
				if !ok || sp.Port != apiPort || sp.TargetPort.String() != "api" {
					t.Errorf("Service %s: port api = %+v (%v), want %d -> api", name, sp, ok, apiPort)
				}
				if _, ok := servicePort(svc, "http"); !ok {
					t.Errorf("Service %s lost port http", name)
				}
			}
			for _, sm := range objectsOf[*monitoringv1.ServiceMonitor](r) {
				for _, ep := range sm.Spec.Endpoints {
					if ep.Port != "http" {
						t.Errorf("ServiceMonitor scrapes port %q; /metrics is on http only", ep.Port)
					}
				}
			}
		})
	}
	if !seen {
		t.Error("no render sets service.apiPort")
	}
}

// TestNetworkPolicyPorts: with service.apiPort the policy has one rule per
// port, the metrics port open to networkPolicy.ingress.from and the API
// port to networkPolicy.ingress.apiFrom (neither list leaks into the
// other); with tracing on, egress reaches the collector's port.
func TestNetworkPolicyPorts(t *testing.T) {
	checked := false
	for _, r := range allRenders(t) {
		for _, np := range objectsOf[*networkingv1.NetworkPolicy](r) {
			t.Run(r.name, func(t *testing.T) {
				v := valuesOf(t, r)
				rules := map[string]networkingv1.NetworkPolicyIngressRule{}
				for _, rule := range np.Spec.Ingress {
					if len(rule.Ports) != 1 || rule.Ports[0].Port == nil {
						t.Fatalf("each ingress rule must name exactly one port, got %+v", rule.Ports)
					}
					name := rule.Ports[0].Port.String()
					if _, dup := rules[name]; dup {
						t.Errorf("two ingress rules for port %s", name)
					}
					rules[name] = rule
				}
				from, _ := value(v, "networkPolicy.ingress.from").([]any)
				apiFrom, _ := value(v, "networkPolicy.ingress.apiFrom").([]any)
				httpRule, ok := rules["http"]
				if !ok {
					t.Fatal("no ingress rule for port http")
				}
				own := 1 // the helm test pod
				if dynamicRender(v) {
					own++ // and the release's pods (forwarded reads)
				}
				if len(from) > 0 && len(httpRule.From) != len(from)+own {
					t.Errorf("port http: %d peers, want networkPolicy.ingress.from (%d) and the chart's own %d", len(httpRule.From), len(from), own)
				}
				if intValue(v, "service.apiPort") == 0 {
					if len(rules) != 1 {
						t.Errorf("no apiPort: want one ingress rule (http), got %v", rules)
					}
				} else {
					checked = true
					apiRule, ok := rules["api"]
					if !ok || len(rules) != 2 {
						t.Fatalf("apiPort set: want ingress rules for http and api, got %v", rules)
					}
					if len(apiRule.From) != len(apiFrom) {
						t.Errorf("port api: %d peers, want networkPolicy.ingress.apiFrom (%d)", len(apiRule.From), len(apiFrom))
					}
					for _, p := range apiRule.From {
						if p.PodSelector != nil && p.PodSelector.MatchLabels["app.kubernetes.io/component"] == "test" {
							t.Errorf("the test pod is let into the API port; it needs only http")
						}
					}
					for _, a := range apiRule.From {
						for _, h := range httpRule.From {
							if fmt.Sprint(a) == fmt.Sprint(h) {
								t.Errorf("peer %v reaches both ports", a)
							}
						}
					}
				}
				otlp := stringValue(v, "tracing.otlpEndpoint")
				otlpTo, _ := value(v, "networkPolicy.otlp.to").([]any)
				found := false
				for _, rule := range np.Spec.Egress {
					for _, p := range rule.Ports {
						if p.Port != nil && p.Port.IntValue() == 4318 {
							found = true
							if len(rule.To) != len(otlpTo) {
								t.Errorf("egress to the collector: %d peers, want networkPolicy.otlp.to (%d)", len(rule.To), len(otlpTo))
							}
						}
					}
				}
				if found != strings.Contains(otlp, ":4318") {
					t.Errorf("egress to port 4318: %v, tracing.otlpEndpoint %q", found, otlp)
				}
			})
		}
	}
	if !checked {
		t.Error("no render has a NetworkPolicy with service.apiPort set")
	}
}

// TestIngress: off by default; when on, one rule per replica (each
// replica serves the status page of its own partitions) for /ui on the
// API port of a Service that selects exactly that pod, with the class,
// annotations and TLS of the values.
func TestIngress(t *testing.T) {
	if n := len(objectsOf[*networkingv1.Ingress](renderByName(t, "chart-defaults"))); n != 0 {
		t.Errorf("default render has %d Ingresses; it must be off by default", n)
	}
	r := renderByName(t, uiIngressRender)
	v := valuesOf(t, r)
	checkIngress(t, r, v)
}

// TestIngressOneReplica: with one replica the Ingress goes to the release's
// Service itself (no per-replica Services, the host as given).
func TestIngressOneReplica(t *testing.T) {
	r := renderByName(t, uiIngressRender)
	out, stderr, err := helm(templateArgs("-f", r.values, "--set", "replicaCount=1")...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr)
	}
	objs, err := decodeAll(strictDecoder(t), out)
	if err != nil {
		t.Fatal(err)
	}
	one := &render{name: "ui-ingress-one-replica", values: r.values, objects: objs}
	v := valuesOf(t, r)
	v["replicaCount"] = float64(1)
	checkIngress(t, one, v)
}

func checkIngress(t *testing.T, r *render, v map[string]any) {
	t.Helper()
	ings := objectsOf[*networkingv1.Ingress](r)
	if len(ings) != 1 {
		t.Fatalf("%s: want one Ingress, got %d", r.name, len(ings))
	}
	ing := ings[0]
	sts, c := worker(t, r)
	n := int(*sts.Spec.Replicas)
	if n != intValue(v, "replicaCount") {
		t.Fatalf("replicas %d, values %d", n, intValue(v, "replicaCount"))
	}
	if cls := stringValue(v, "ingress.className"); (cls == "") != (ing.Spec.IngressClassName == nil) || (cls != "" && *ing.Spec.IngressClassName != cls) {
		t.Errorf("ingressClassName = %v, want %q", ing.Spec.IngressClassName, cls)
	}
	if ann, _ := value(v, "ingress.annotations").(map[string]any); len(ann) > 0 {
		for k, want := range ann {
			if ing.Annotations[k] != want {
				t.Errorf("annotation %s = %q, want %q", k, ing.Annotations[k], want)
			}
		}
	}
	tls, _ := value(v, "ingress.tls").([]any)
	if len(ing.Spec.TLS) != len(tls) || (len(tls) > 0 && ing.Spec.TLS[0].SecretName != stringValue(tls[0].(map[string]any), "secretName")) {
		t.Errorf("tls = %+v, want %v", ing.Spec.TLS, tls)
	}
	host := stringValue(v, "ingress.host")
	if len(ing.Spec.Rules) != n {
		t.Fatalf("%d rules, want one per replica (%d)", len(ing.Spec.Rules), n)
	}
	_, apiOn := containerPort(c, "api")
	wantPort := "http"
	if apiOn {
		wantPort = "api"
	}
	svcs := map[string]*corev1.Service{}
	for _, s := range objectsOf[*corev1.Service](r) {
		svcs[s.Name] = s
	}
	for i, rule := range ing.Spec.Rules {
		wantHost, wantSvc := host, fullname
		if n > 1 {
			wantHost = fmt.Sprintf("%d.%s", i, host)
			wantSvc = fmt.Sprintf("%s-ui-%d", fullname, i)
		}
		if rule.Host != wantHost {
			t.Errorf("rule %d: host %q, want %q", i, rule.Host, wantHost)
		}
		if rule.HTTP == nil || len(rule.HTTP.Paths) != 1 {
			t.Fatalf("rule %d: want one path", i)
		}
		p := rule.HTTP.Paths[0]
		if p.Path != "/ui" || p.PathType == nil || *p.PathType != networkingv1.PathTypePrefix {
			t.Errorf("rule %d: path %q type %v, want /ui Prefix (the status page only, never /metrics or /v1)", i, p.Path, p.PathType)
		}
		b := p.Backend.Service
		if b == nil || b.Name != wantSvc || b.Port.Name != wantPort {
			t.Fatalf("rule %d: backend %+v, want Service %s port %s", i, b, wantSvc, wantPort)
		}
		svc := svcs[b.Name]
		if svc == nil {
			t.Fatalf("rule %d: backend Service %s is not rendered", i, b.Name)
		}
		sp, ok := servicePort(svc, wantPort)
		if !ok || sp.TargetPort.String() != wantPort {
			t.Errorf("Service %s: port %s = %+v (%v)", svc.Name, wantPort, sp, ok)
		}
		if n > 1 {
			pod := fmt.Sprintf("%s-%d", sts.Name, i)
			if svc.Spec.Selector["statefulset.kubernetes.io/pod-name"] != pod {
				t.Errorf("Service %s selects %v, want exactly pod %s", svc.Name, svc.Spec.Selector, pod)
			}
			if svc.Labels["telha.io/service"] == "http" {
				t.Errorf("Service %s carries telha.io/service=http: the ServiceMonitor would scrape it too", svc.Name)
			}
			if _, ok := servicePort(svc, "http"); ok {
				t.Errorf("Service %s exposes port http (/metrics); it is for the status page only", svc.Name)
			}
		}
	}
	if n == 1 {
		for name := range svcs {
			if strings.Contains(name, "-ui-") {
				t.Errorf("one replica: unexpected per-replica Service %s", name)
			}
		}
	}
}

// TestExtraVolumesAndEnv: extraVolumes, extraVolumeMounts and extraEnv
// reach the pod as given, next to the chart's own.
func TestExtraVolumesAndEnv(t *testing.T) {
	seen := false
	for _, r := range allRenders(t) {
		t.Run(r.name, func(t *testing.T) {
			v := valuesOf(t, r)
			sts, c := worker(t, r)
			vols, _ := value(v, "extraVolumes").([]any)
			mounts, _ := value(v, "extraVolumeMounts").([]any)
			envs, _ := value(v, "extraEnv").([]any)
			seen = seen || (len(vols) > 0 && len(mounts) > 0)
			for _, x := range vols {
				name := stringValue(x.(map[string]any), "name")
				if !slices.ContainsFunc(sts.Spec.Template.Spec.Volumes, func(vol corev1.Volume) bool { return vol.Name == name }) {
					t.Errorf("extra volume %s missing", name)
				}
			}
			for _, x := range mounts {
				m := x.(map[string]any)
				name, path := stringValue(m, "name"), stringValue(m, "mountPath")
				ro, _ := m["readOnly"].(bool)
				if !slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool {
					return vm.Name == name && vm.MountPath == path && vm.ReadOnly == ro
				}) {
					t.Errorf("extra mount %s at %s (readOnly %v) missing", name, path, ro)
				}
			}
			for _, x := range envs {
				name := stringValue(x.(map[string]any), "name")
				if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name }) {
					t.Errorf("extra env %s missing", name)
				}
			}
			// The chart's own volumes stay.
			for _, want := range []string{"data", "tmp"} {
				if !slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool { return vm.Name == want }) {
					t.Errorf("mount %s missing", want)
				}
			}
			// Every mount has a volume (or the claim template).
			for _, vm := range c.VolumeMounts {
				if vm.Name == "data" {
					continue
				}
				if !slices.ContainsFunc(sts.Spec.Template.Spec.Volumes, func(vol corev1.Volume) bool { return vol.Name == vm.Name }) {
					t.Errorf("mount %s has no volume", vm.Name)
				}
			}
		})
	}
	if !seen {
		t.Error("no render sets extraVolumes and extraVolumeMounts")
	}
}

// TestNotes: what `helm install` prints names the status page, how to reach
// it (port-forward to a replica on the API port, or the Ingress hosts),
// where the read API's tokens come from, and the ownership: the slots and
// their changelogs in dynamic mode, each replica's partitions in static.
// Who the read API answers follows the auth mode (issue 32): the Service
// (dynamic) or a replica's stable name (static) for token holders, or
// anyone with auth.mode off; without tokens, port-forward and exec only,
// never a claim that the Service serves reads. The streams are the
// worker's to provision (never "must map"), and the chart's default image,
// which is not published, comes with a warning that says how to build one.
func TestNotes(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want []string
		not  []string
	}{
		{"defaults", nil, []string{
			"/ui/",
			"kubectl -n graph port-forward pod/telha-telha-cascade-0 8080:8080",
			"http://localhost:8080/ui/",
			"auth.tokensSecret",
			"loopback",
			"Ownership: dynamic",
			"slot 0: partitions 0 8 ",
			"TELHA_LOG_STATIC8_<i>",
			"TELHA_OWNERS_8",
			"forwards a read",
			"answers only clients that come\nthrough kubectl port-forward or exec",
			"kubectl -n graph port-forward svc/telha-telha-cascade 8080:8080\n  curl localhost:8080/v1/tenants/<tenant>/...",
			"answers any other client 401 until you set\nauth.tokensSecret",
			"The worker creates or updates its streams at start (TELHA_REQ",
			"{{partition(16,1)}}",
			"give them the same configuration",
			"WARNING: image.repository is the chart's default, ghcr.io/telha/telha-cascade",
			"go run ./cmd/build-image",
			"Dockerfile",
			"--set image.repository=<registry>/telha-cascade --set image.tag=<tag>",
		}, []string{"Through the Ingress", "Ownership: static", "serves reads for every tenant", "must map"}},
		{"ui-ingress", []string{"-f", "telha-cascade/ci/ui-ingress-values.yaml"}, []string{
			"kubectl -n graph port-forward pod/telha-telha-cascade-0 8081:8081",
			"http://localhost:8081/ui/",
			"Secret telha-api-tokens",
			"https://0.telha.example.com/ui/",
			"https://1.telha.example.com/ui/",
			"operate",
			"--otlp-endpoint",
			"Ownership: static",
			"telha-telha-cascade-1: partitions 1 3 5 7 ",
			"TELHA_LOG_STATIC2_<i>",
			"through its stable name (with a token",
			"http://telha-telha-cascade-<i>.telha-telha-cascade-headless.graph.svc:8081/v1/journals",
			"The worker creates or updates its streams at start",
		}, []string{"loopback", "Ownership: dynamic", "forwards a read", "401", "must map", "WARNING: image.repository"}},
		{"auth off", []string{"--set", "auth.mode=off"}, []string{"/ui/", "auth.mode is off",
			"the release's Service serves reads for every tenant, to every client that\nreaches it",
			"http://telha-telha-cascade.graph.svc:8080/v1/tenants/<tenant>/...",
		}, []string{"401", "loopback"}},
		{"dynamic with tokens", []string{"-f", "telha-cascade/ci/three-replicas-values.yaml"}, []string{
			"the release's Service serves reads for every tenant to token holders",
			"http://telha-telha-cascade.graph.svc:8080/v1/tenants/<tenant>/...",
			"Secret telha-api-tokens",
		}, []string{"loopback", "401", "port-forward or exec"}},
		{"static without tokens", []string{"--set", "ownership.mode=static", "--set", "replicaCount=2"}, []string{
			"Ownership: static",
			"answers only clients that come through kubectl port-forward or exec",
			"kubectl -n graph port-forward pod/telha-telha-cascade-<i> 8080:8080",
			"answers\nany other client 401 until you set auth.tokensSecret",
			"The worker creates or updates its streams at start",
		}, []string{"serves reads for every tenant", "through its stable name", "must map"}},
		{"own image", []string{"--set", "image.repository=registry.example.com/telha/telha-cascade", "--set", "image.tag=dev"},
			[]string{"Ownership: dynamic"}, []string{"WARNING: image.repository", "build-image"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"install", releaseName, "./" + chartDir, "--namespace", namespace, "--dry-run=client"}, tc.args...)
			out, stderr, err := helm(args...)
			if err != nil {
				t.Fatalf("helm install --dry-run: %v\n%s", err, stderr)
			}
			_, notes, ok := strings.Cut(string(out), "\nNOTES:\n")
			if !ok {
				t.Fatalf("no NOTES in the output:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(notes, w) {
					t.Errorf("NOTES do not mention %q:\n%s", w, notes)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(notes, w) {
					t.Errorf("NOTES mention %q:\n%s", w, notes)
				}
			}
		})
	}
}
