package chartcheck

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// ownership.mode (issue 21, "Partitions that outlive their pod"): dynamic
// (the default) runs every pod as a member of a group among which
// ownership.slots slots move (--partition-owner dynamic/<slots>, the
// changelog on JetStream, reads forwarded between pods); static is the
// chart's earlier behaviour (--partition-owner auto/<replicaCount>), with
// the changelog only when changelog.enabled.

// renderObjects renders the chart with --set args and returns its objects.
func renderObjects(t *testing.T, set ...string) []runtime.Object {
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
	return objs
}

func statefulSetOf(t *testing.T, objs []runtime.Object) (*appsv1.StatefulSet, corev1.Container) {
	t.Helper()
	r := &render{name: "set", objects: objs}
	return worker(t, r)
}

// memberFlags are the flags only dynamic mode passes.
var memberFlags = []string{"--member-id", "--advertise-url", "--standbys", "--member-ttl", "--forward-wait"}

// changelogFlags are the flags of the changelog (dynamic, or static with
// changelog.enabled).
var changelogFlags = []string{"--changelog", "--changelog-replicas", "--checkpoint-schedule", "--checkpoints-keep", "--checkpoint-upload-rate"}

// TestOwnershipDynamicDefaults: the chart's defaults run dynamic/8 with the
// changelog, each pod named and advertised by its own stable DNS name
// (POD_NAME from the downward API, expanded by Kubernetes in the args).
func TestOwnershipDynamicDefaults(t *testing.T) {
	sts, c := worker(t, renderByName(t, "chart-defaults"))
	headless := fullname + "-headless"
	want := map[string]string{
		"--partition-owner":        "dynamic/8",
		"--partitions":             "16",
		"--changelog":              "jetstream",
		"--member-id":              "$(POD_NAME)",
		"--advertise-url":          fmt.Sprintf("http://$(POD_NAME).%s.%s.svc.cluster.local:8080", headless, namespace),
		"--standbys":               "1",
		"--member-ttl":             "6s",
		"--forward-wait":           "10s",
		"--checkpoint-schedule":    "@every 10m",
		"--checkpoints-keep":       "2",
		"--checkpoint-upload-rate": "16MiB",
		"--http-addr":              ":8080",
	}
	for f, v := range want {
		if got, ok := argValue(c.Args, f); !ok || got != v {
			t.Errorf("%s = %q (passed %v), want %q", f, got, ok, v)
		}
	}
	for _, f := range []string{"--changelog-replicas", "--api-addr"} {
		if got, ok := argValue(c.Args, f); ok {
			t.Errorf("%s=%s passed; want it left out (changelog.replicas 0: the worker uses --stream-replicas; dynamic has no API port)", f, got)
		}
	}
	// $(POD_NAME) expands only from the container's own environment.
	pn := envNamed(c, "POD_NAME")
	if len(pn) != 1 || pn[0].ValueFrom == nil || pn[0].ValueFrom.FieldRef == nil || pn[0].ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("env POD_NAME = %+v, want exactly one, from fieldRef metadata.name", pn)
	}
	if sts.Spec.ServiceName != headless {
		t.Errorf("serviceName %q, want %q (the advertise URL's domain)", sts.Spec.ServiceName, headless)
	}
	checkProbe(t, "readiness", c.ReadinessProbe, "/readyz")
	for k, v := range map[string]string{"telha.io/ownership": "dynamic", "telha.io/changelog": "jetstream", "telha.io/slots": "8", "telha.io/partitions": "16"} {
		if got := sts.Annotations[k]; got != v {
			t.Errorf("annotation %s = %q, want %q", k, got, v)
		}
	}
}

// TestOwnershipDynamicValues: each ownership and changelog value reaches
// its flag; changelog.replicas > 0 passes --changelog-replicas; the
// advertise URL follows service.port, clusterDomain and the namespace.
func TestOwnershipDynamicValues(t *testing.T) {
	_, c := statefulSetOf(t, renderObjects(t,
		"replicaCount=3", "partitions=12", "auth.tokensSecret=t", "service.port=9090", "clusterDomain=k8s.example",
		"ownership.slots=6", "ownership.standbys=2", "ownership.memberTTL=15s", "ownership.forwardWait=30s",
		"changelog.replicas=3", "changelog.checkpointSchedule=*/5 * * * *", "changelog.checkpointsKeep=4",
		"changelog.uploadRate=4MiB"))
	want := map[string]string{
		"--partition-owner":        "dynamic/6",
		"--partitions":             "12",
		"--changelog":              "jetstream",
		"--advertise-url":          fmt.Sprintf("http://$(POD_NAME).%s-headless.%s.svc.k8s.example:9090", fullname, namespace),
		"--standbys":               "2",
		"--member-ttl":             "15s",
		"--forward-wait":           "30s",
		"--changelog-replicas":     "3",
		"--checkpoint-schedule":    "*/5 * * * *",
		"--checkpoints-keep":       "4",
		"--checkpoint-upload-rate": "4MiB",
		"--http-addr":              ":9090",
	}
	for f, v := range want {
		if got, ok := argValue(c.Args, f); !ok || got != v {
			t.Errorf("%s = %q (passed %v), want %q", f, got, ok, v)
		}
	}
}

// staticDefaultArgs are the worker's arguments of the chart's defaults
// before ownership.mode existed: static mode must keep them exactly.
var staticDefaultArgs = []string{
	"--data-dir=/data", "--http-addr=:8080", "--nats-url=nats://nats.nats.svc.cluster.local:4222", "--stream-replicas=3",
	"--partitions=16", "--partition-owner=auto/1", "--max-batch-ops=100000", "--max-deliver=5", "--max-deaths=3",
	"--ack-wait=30s", "--shutdown-grace=60s", "--results-max-age=24h", "--dlq-max-age=336h", "--results-max-bytes=1GiB",
	"--dlq-max-bytes=1GiB", "--results-max-per-tenant=1000000", "--dlq-max-per-tenant=10000", "--reaper-schedule=@every 30s",
	"--log-format=json",
}

// TestOwnershipStaticUnchanged: ownership.mode=static renders the worker's
// arguments of the chart before dynamic mode, exactly; changelog.enabled
// adds the changelog flags (and nothing of dynamic mode).
func TestOwnershipStaticUnchanged(t *testing.T) {
	sts, c := statefulSetOf(t, renderObjects(t, "ownership.mode=static"))
	if !slices.Equal(c.Args, staticDefaultArgs) {
		t.Errorf("static args changed:\n got %q\nwant %q", c.Args, staticDefaultArgs)
	}
	if sts.Annotations["telha.io/ownership"] != "static" || sts.Annotations["telha.io/changelog"] != "off" {
		t.Errorf("annotations %v, want telha.io/ownership static and telha.io/changelog off", sts.Annotations)
	}
	if _, ok := sts.Annotations["telha.io/slots"]; ok {
		t.Errorf("static mode records telha.io/slots")
	}

	_, c = statefulSetOf(t, renderObjects(t, "ownership.mode=static", "replicaCount=3", "auth.tokensSecret=t"))
	if got, _ := argValue(c.Args, "--partition-owner"); got != "auto/3" {
		t.Errorf("static, three replicas: --partition-owner = %q, want auto/3", got)
	}
	for _, f := range append(slices.Clone(memberFlags), changelogFlags...) {
		if _, ok := argValue(c.Args, f); ok {
			t.Errorf("static without changelog passes %s", f)
		}
	}

	sts, c = statefulSetOf(t, renderObjects(t, "ownership.mode=static", "replicaCount=2", "changelog.enabled=true",
		"changelog.replicas=3", "changelog.checkpointSchedule=@every 1h", "changelog.checkpointsKeep=3"))
	for f, v := range map[string]string{"--partition-owner": "auto/2", "--changelog": "jetstream", "--changelog-replicas": "3",
		"--checkpoint-schedule": "@every 1h", "--checkpoints-keep": "3"} {
		if got, ok := argValue(c.Args, f); !ok || got != v {
			t.Errorf("static with changelog: %s = %q (passed %v), want %q", f, got, ok, v)
		}
	}
	for _, f := range memberFlags {
		if _, ok := argValue(c.Args, f); ok {
			t.Errorf("static with changelog passes the member flag %s", f)
		}
	}
	if sts.Annotations["telha.io/changelog"] != "jetstream" {
		t.Errorf("telha.io/changelog = %q, want jetstream", sts.Annotations["telha.io/changelog"])
	}
	// The other static renders keep their earlier flags too: the same
	// arguments with and without the changelog, bar the changelog's.
	_, plain := statefulSetOf(t, renderObjects(t, "ownership.mode=static", "replicaCount=2"))
	var rest []string
	for _, a := range c.Args {
		if f, _, _ := strings.Cut(a, "="); !slices.Contains(changelogFlags, f) {
			rest = append(rest, a)
		}
	}
	if !slices.Equal(rest, plain.Args) {
		t.Errorf("changelog.enabled changed more than the changelog flags:\n got %q\nwant %q", rest, plain.Args)
	}
}

// TestOwnershipRejects: combinations dynamic mode cannot run.
func TestOwnershipRejects(t *testing.T) {
	cases := []struct {
		name string
		set  string
		want []string
	}{
		{"dynamic with an API port", "service.apiPort=8081", []string{"service.apiPort", "dynamic"}},
		{"more pods than slots", "replicaCount=9,auth.tokensSecret=t", []string{"replicaCount (9)", "ownership.slots (8)"}},
		{"more slots than partitions", "ownership.slots=17", []string{"ownership.slots (17)", "partitions (16)"}},
		{"pods without tokens", "replicaCount=2", []string{"forwarded", "auth.tokensSecret", "auth.mode=off"}},
		{"unknown mode", "ownership.mode=auto", nil},
		{"zero slots", "ownership.slots=0", nil},
		{"too many standbys", "ownership.standbys=5", nil},
		{"member TTL without a unit", "ownership.memberTTL=6", nil},
		{"forward wait without a unit", "ownership.forwardWait=10", nil},
		{"changelog replicas above 5", "changelog.replicas=6", nil},
		{"no checkpoint kept", "changelog.checkpointsKeep=0", nil},
		{"empty checkpoint schedule", "changelog.checkpointSchedule=", nil},
		{"unknown key in ownership", "ownership.slot=4", []string{"additional properties"}},
		{"unknown key in changelog", "changelog.enable=true", []string{"additional properties"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err := helm(templateArgs("--set", tc.set)...)
			if err == nil {
				t.Fatalf("helm template --set %s succeeded; the chart must refuse it", tc.set)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(stderr), w) {
					t.Errorf("error does not mention %q:\n%s", w, stderr)
				}
			}
		})
	}
	// The same without the bad part renders: the refusals above come from
	// the values, not from something else.
	for _, valid := range []string{
		"service.apiPort=8081,ownership.mode=static",
		"replicaCount=8,auth.tokensSecret=t",
		"replicaCount=2,auth.mode=off",
		"ownership.slots=16,replicaCount=16,auth.tokensSecret=t",
		"ownership.mode=static,replicaCount=2",
		"ownership.mode=static,partitions=4",
		"ownership.slots=4,partitions=4,ownership.standbys=0,ownership.forwardWait=0s",
	} {
		if _, stderr, err := helm(templateArgs("--set", valid)...); err != nil {
			t.Errorf("a valid --set %s failed: %v\n%s", valid, err, stderr)
		}
	}
}

// TestOwnershipNetworkPolicy: in dynamic mode the pods of the release
// reach each other on the HTTP port (a member forwards a read to the
// slot's owner): an ingress peer when networkPolicy.ingress.from narrows
// the port, and always an egress rule. Static pods never talk to each
// other, so static mode has neither.
func TestOwnershipNetworkPolicy(t *testing.T) {
	self := map[string]string{
		"app.kubernetes.io/name":      "telha-cascade",
		"app.kubernetes.io/instance":  releaseName,
		"app.kubernetes.io/component": "worker",
	}
	isSelf := func(p networkingv1.NetworkPolicyPeer) bool {
		return p.PodSelector != nil && p.NamespaceSelector == nil && p.IPBlock == nil &&
			fmt.Sprint(p.PodSelector.MatchLabels) == fmt.Sprint(self) && len(p.PodSelector.MatchExpressions) == 0
	}
	const from = "networkPolicy.ingress.from[0].namespaceSelector.matchLabels.team=monitoring"
	for _, tc := range []struct {
		name    string
		set     []string
		dynamic bool
	}{
		{"dynamic, ingress.from set", []string{"networkPolicy.enabled=true", from, "replicaCount=3", "auth.tokensSecret=t"}, true},
		{"dynamic, any source", []string{"networkPolicy.enabled=true", "replicaCount=3", "auth.mode=off"}, true},
		{"static, ingress.from set", []string{"networkPolicy.enabled=true", from, "replicaCount=3", "ownership.mode=static"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var np *networkingv1.NetworkPolicy
			for _, o := range renderObjects(t, tc.set...) {
				if v, ok := o.(*networkingv1.NetworkPolicy); ok {
					np = v
				}
			}
			if np == nil {
				t.Fatal("no NetworkPolicy")
			}
			narrowed := slices.Contains(tc.set, from)
			for _, rule := range np.Spec.Ingress {
				if rule.Ports[0].Port.String() != "http" {
					continue
				}
				hasSelf := slices.ContainsFunc(rule.From, isSelf)
				switch {
				case !narrowed && len(rule.From) != 0:
					t.Errorf("ingress.from empty: want port http open to any source, got %+v", rule.From)
				case narrowed && hasSelf != tc.dynamic:
					t.Errorf("port http: the release's own pods among the peers: %v, want %v", hasSelf, tc.dynamic)
				}
			}
			egress := false
			for _, rule := range np.Spec.Egress {
				if slices.ContainsFunc(rule.To, isSelf) {
					egress = true
					if len(rule.To) != 1 || len(rule.Ports) != 1 || rule.Ports[0].Port.IntValue() != 8080 ||
						rule.Ports[0].Protocol == nil || *rule.Ports[0].Protocol != corev1.ProtocolTCP {
						t.Errorf("egress to the release's pods: want only TCP 8080, got %+v", rule)
					}
				}
			}
			if egress != tc.dynamic {
				t.Errorf("egress to the release's pods: %v, want %v", egress, tc.dynamic)
			}
		})
	}
}
