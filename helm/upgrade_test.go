package chartcheck

import (
	"fmt"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	"helm.sh/helm/v4/pkg/strvals"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

// The upgrade guards (telha-cascade.validate) read the live StatefulSet
// with `lookup`, which `helm template` answers with nothing. These tests
// render the chart with Helm's own engine and a fake cluster that holds a
// StatefulSet of an earlier release, as `helm upgrade` would see it.

// clusterWith is a fake cluster holding the release's StatefulSet with
// these annotations (none: no StatefulSet, a fresh install).
type clusterWith map[string]string

func (c clusterWith) GetClientFor(apiVersion, kind string) (dynamic.NamespaceableResourceInterface, bool, error) {
	gvr := schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "statefulsets"}
	if apiVersion != "apps/v1" || kind != "StatefulSet" {
		return nil, false, fmt.Errorf("the chart looks up only apps/v1 StatefulSets, not %s %s", apiVersion, kind)
	}
	var objs []runtime.Object
	if c != nil {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("apps/v1")
		u.SetKind("StatefulSet")
		u.SetNamespace(namespace)
		u.SetName(fullname)
		u.SetAnnotations(c)
		objs = append(objs, u)
	}
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{gvr: "StatefulSetList"}, objs...)
	return client.Resource(gvr), true, nil
}

// renderUpgrade renders the chart as `helm upgrade --set set...` against a
// cluster holding a StatefulSet with the annotations ann (nil: none), and
// returns the rendered StatefulSet manifest or the error.
func renderUpgrade(t *testing.T, ann map[string]string, set ...string) (string, error) {
	t.Helper()
	ch, err := loader.LoadDir(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]any{}
	for _, s := range set {
		if err := strvals.ParseInto(s, vals); err != nil {
			t.Fatalf("--set %s: %v", s, err)
		}
	}
	top, err := chartutil.ToRenderValues(ch, vals, common.ReleaseOptions{
		Name: releaseName, Namespace: namespace, Revision: 2, IsUpgrade: true,
	}, nil)
	if err != nil {
		return "", err
	}
	out, err := engine.RenderWithClientProvider(ch, top, clusterWith(ann))
	if err != nil {
		return "", err
	}
	for name, body := range out {
		if strings.HasSuffix(name, "templates/statefulset.yaml") {
			return body, nil
		}
	}
	t.Fatal("no templates/statefulset.yaml rendered")
	return "", nil
}

// Annotations of StatefulSets of earlier releases.
var (
	// The chart before ownership.mode: static, no changelog, nothing
	// recorded but partitions and replicas.
	oldChart = map[string]string{"telha.io/partitions": "16", "telha.io/replicas": "3"}
	static3  = map[string]string{"telha.io/partitions": "16", "telha.io/replicas": "3", "telha.io/ownership": "static", "telha.io/changelog": "off"}
	static3L = map[string]string{"telha.io/partitions": "16", "telha.io/replicas": "3", "telha.io/ownership": "static", "telha.io/changelog": "jetstream"}
	dyn8     = map[string]string{"telha.io/partitions": "16", "telha.io/replicas": "2", "telha.io/ownership": "dynamic", "telha.io/changelog": "jetstream", "telha.io/slots": "8"}
)

// TestUpgradeGuards: what `helm upgrade` refuses, and what it lets
// through, given the StatefulSet an earlier release left.
func TestUpgradeGuards(t *testing.T) {
	const tok = "auth.tokensSecret=t"
	cases := []struct {
		name string
		ann  map[string]string
		set  []string
		want []string // substrings of the error; nil: the upgrade renders
	}{
		{"fresh install, dynamic defaults", nil, nil, nil},
		{"fresh install, dynamic, three pods", nil, []string{"replicaCount=3", tok}, nil},

		// Static releases without a changelog cannot go straight to dynamic.
		{"old chart straight to dynamic", oldChart, []string{"replicaCount=3", "ownership.slots=3", tok},
			[]string{"ownership.mode=static", "changelog.enabled=true", "ownership.slots=3"}},
		{"static without changelog straight to dynamic", static3, []string{"replicaCount=3", "ownership.slots=3", tok},
			[]string{"ownership.mode=static", "changelog.enabled=true", "ownership.slots=3"}},
		{"old chart, step 1: static with the changelog", oldChart, []string{"ownership.mode=static", "replicaCount=3", "changelog.enabled=true"}, nil},
		{"static with changelog, step 2: dynamic with slots = old replicas", static3L, []string{"replicaCount=3", "ownership.slots=3", tok}, nil},
		{"static with changelog, step 2 with fewer pods", static3L, []string{"replicaCount=2", "ownership.slots=3", tok}, nil},
		{"static with changelog to dynamic with other slots", static3L, []string{"replicaCount=3", "ownership.slots=8", tok},
			[]string{"ownership.slots", "3"}},

		// Static stays as it was: replicaCount and partitions fixed.
		{"static, same layout", static3, []string{"ownership.mode=static", "replicaCount=3"}, nil},
		{"static, replicaCount changed", static3, []string{"ownership.mode=static", "replicaCount=4"}, []string{"replicaCount changes partition ownership"}},
		{"old chart, static, replicaCount changed", oldChart, []string{"ownership.mode=static", "replicaCount=2"}, []string{"replicaCount changes partition ownership"}},
		{"static, partitions changed", static3, []string{"ownership.mode=static", "replicaCount=3", "partitions=32"}, []string{"partitions is fixed"}},

		// Dynamic: replicaCount moves freely, slots and partitions are fixed.
		{"dynamic, more pods", dyn8, []string{"replicaCount=5", tok}, nil},
		{"dynamic, one pod", dyn8, []string{"replicaCount=1"}, nil},
		{"dynamic, slots changed", dyn8, []string{"replicaCount=2", "ownership.slots=4", tok}, []string{"ownership.slots is fixed", "8"}},
		{"dynamic, partitions changed", dyn8, []string{"replicaCount=2", "partitions=32", tok}, []string{"partitions is fixed"}},

		// Back from dynamic to static: only with the changelog, one
		// replica per slot.
		{"dynamic back to static with the changelog", dyn8, []string{"ownership.mode=static", "changelog.enabled=true", "replicaCount=8"}, nil},
		{"dynamic back to static without the changelog", dyn8, []string{"ownership.mode=static", "replicaCount=8"}, []string{"changelog.enabled=true"}},
		{"dynamic back to static with other replicas", dyn8, []string{"ownership.mode=static", "changelog.enabled=true", "replicaCount=4"}, []string{"replicaCount", "8"}},

		// allowTopologyChange lets a planned data move through.
		{"old chart to dynamic, allowTopologyChange", oldChart, []string{"replicaCount=3", "ownership.slots=3", tok, "allowTopologyChange=true"}, nil},
		{"dynamic, slots changed, allowTopologyChange", dyn8, []string{"ownership.slots=4", tok, "allowTopologyChange=true"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body, err := renderUpgrade(t, tc.ann, tc.set...)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("upgrade refused: %v", err)
				}
				if !strings.Contains(body, "kind: StatefulSet") {
					t.Fatalf("no StatefulSet rendered:\n%s", body)
				}
				return
			}
			if err == nil {
				t.Fatalf("upgrade rendered; want it refused (mentioning %q)", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestUpgradeRecordsLayout: the StatefulSet records what the next upgrade
// checks (ownership mode, changelog, slots in dynamic mode, partitions,
// replicas).
func TestUpgradeRecordsLayout(t *testing.T) {
	cases := []struct {
		set  []string
		want map[string]string
	}{
		{nil, map[string]string{"telha.io/ownership": "dynamic", "telha.io/changelog": "jetstream", "telha.io/slots": "8", "telha.io/partitions": "16", "telha.io/replicas": "1"}},
		{[]string{"ownership.mode=static", "replicaCount=3"}, map[string]string{"telha.io/ownership": "static", "telha.io/changelog": "off", "telha.io/partitions": "16", "telha.io/replicas": "3"}},
		{[]string{"ownership.mode=static", "changelog.enabled=true"}, map[string]string{"telha.io/ownership": "static", "telha.io/changelog": "jetstream"}},
	}
	for _, tc := range cases {
		body, err := renderUpgrade(t, nil, tc.set...)
		if err != nil {
			t.Fatalf("%v: %v", tc.set, err)
		}
		for k, v := range tc.want {
			if line := fmt.Sprintf("%s: %q", k, v); !strings.Contains(body, line) {
				t.Errorf("%v: the StatefulSet does not record %s", tc.set, line)
			}
		}
		if static := len(tc.set) > 0; static && strings.Contains(body, "telha.io/slots") {
			t.Errorf("%v: static mode records telha.io/slots", tc.set)
		}
	}
}
