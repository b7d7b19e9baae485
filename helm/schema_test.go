package chartcheck

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestSchemaClosedEverywhere walks values.schema.json: every schema with
// properties must set additionalProperties: false, and every other object
// schema (a free-form map such as labels) must give its values a type
// instead of allowing anything.
func TestSchemaClosedEverywhere(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var root map[string]any
	if err := json.Unmarshal(b, &root); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	objects := 0
	var walk func(path string, node map[string]any)
	walk = func(path string, node map[string]any) {
		isObject := node["type"] == "object"
		if _, ok := node["properties"]; ok {
			isObject = true
		}
		if isObject {
			objects++
			ap, has := node["additionalProperties"]
			_, hasProps := node["properties"]
			switch {
			case !has:
				t.Errorf("%s: object without additionalProperties", path)
			case hasProps && ap != false:
				t.Errorf("%s: object with properties must have additionalProperties: false", path)
			case !hasProps:
				if _, isSchema := ap.(map[string]any); !isSchema {
					t.Errorf("%s: free-form object must type its values (additionalProperties: {...}), got %v", path, ap)
				}
			}
		}
		keys := make([]string, 0, len(node))
		for k := range node {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			switch v := node[k].(type) {
			case map[string]any:
				if k == "properties" || k == "definitions" || k == "$defs" {
					for name, sub := range v {
						if m, ok := sub.(map[string]any); ok {
							walk(path+"."+name, m)
						}
					}
				} else {
					walk(path+"/"+k, v)
				}
			case []any:
				for i, item := range v {
					if m, ok := item.(map[string]any); ok {
						walk(fmt.Sprintf("%s/%s[%d]", path, k, i), m)
					}
				}
			}
		}
	}
	walk("$", root)
	if objects < 20 {
		t.Errorf("only %d object schemas found; is the schema complete?", objects)
	}
}

// TestSchemaRejects renders with values the chart must refuse: unknown keys
// at several levels (values.schema.json) and combinations the templates
// check.
func TestSchemaRejects(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown top-level key", []string{"--set", "bogus=1"}, "additional properties"},
		{"misspelt key", []string{"--set", "replicaCounts=3"}, "additional properties"},
		{"unknown nested key", []string{"--set", "image.bogus=x"}, "additional properties"},
		{"unknown deep key", []string{"--set", "prometheusRule.alerts.journalStuck.thresold=5"}, "additional properties"},
		{"unknown key in a peer", []string{"--set", "networkPolicy.ingress.from[0].podSelektor.matchLabels.a=b"}, "additional properties"},
		{"unknown key in securityContext", []string{"--set", "securityContext.readOnlyRootFS=true"}, "additional properties"},
		{"wrong type", []string{"--set", "replicaCount=three"}, ""},
		{"bad log format", []string{"--set", "logFormat=xml"}, ""},
		{"no nats url", []string{"--set", "nats.url="}, ""},
		{"replicas above partitions", []string{"--set", "replicaCount=17"}, "must be <= partitions"},
		{"creds and user/password", []string{"--set", "nats.credentialsSecret.name=s,nats.credentialsSecret.credsKey=c,nats.credentialsSecret.userKey=u,nats.credentialsSecret.passwordKey=p"}, "not both"},
		{"secret without keys", []string{"--set", "nats.credentialsSecret.name=s"}, "credsKey"},
		{"user without password", []string{"--set", "nats.credentialsSecret.name=s,nats.credentialsSecret.userKey=u"}, "credsKey"},
		{"tls without secret", []string{"--set", "nats.tls.enabled=true"}, "secretName"},
		{"tls cert without key", []string{"--set", "nats.tls.enabled=true,nats.tls.secretName=s,nats.tls.keyKey="}, "certKey"},
		{"unknown key in ingress", []string{"--set", "ingress.hosts[0]=x"}, "additional properties"},
		{"unknown key in an ingress tls", []string{"--set", "ingress.tls[0].secret=x"}, "additional properties"},
		{"ingress without host", []string{"--set", "ingress.enabled=true,auth.tokensSecret=t"}, "ingress.host"},
		{"ingress without tokens", []string{"--set", "ingress.enabled=true,ingress.host=telha.example.com"}, "auth.tokensSecret"},
		{"ingress host with a scheme", []string{"--set", "ingress.host=https://telha.example.com"}, ""},
		{"unknown volume source", []string{"--set", "extraVolumes[0].name=x,extraVolumes[0].secrt.secretName=s"}, "additional properties"},
		{"unknown key in a volume source", []string{"--set", "extraVolumes[0].name=x,extraVolumes[0].secret.secretNam=s"}, "additional properties"},
		{"volume without a name", []string{"--set", "extraVolumes[0].emptyDir.medium=Memory"}, ""},
		{"unknown key in a mount", []string{"--set", "extraVolumeMounts[0].name=x,extraVolumeMounts[0].mountPath=/x,extraVolumeMounts[0].readonly=true"}, "additional properties"},
		{"volume named like the chart's", []string{"--set", "extraVolumes[0].name=tmp,extraVolumes[0].emptyDir.medium=Memory"}, "tmp"},
		{"mount of no volume", []string{"--set", "extraVolumeMounts[0].name=nope,extraVolumeMounts[0].mountPath=/x"}, "nope"},
		{"mount over the data directory", []string{"--set", "extraVolumes[0].name=x,extraVolumes[0].emptyDir.medium=Memory,extraVolumeMounts[0].name=x,extraVolumeMounts[0].mountPath=/data"}, "/data"},
		{"extraEnv shadowed by a chart flag", []string{"--set", "extraEnv[0].name=TELHA_NATS_URL,extraEnv[0].value=nats://x:4222"}, "TELHA_NATS_URL"},
		{"extraEnv shadowed by the otlp flag", []string{"--set", "tracing.otlpEndpoint=http://c:4318,extraEnv[0].name=TELHA_OTLP_ENDPOINT,extraEnv[0].value=http://d:4318"}, "TELHA_OTLP_ENDPOINT"},
		{"apiPort equal to port", []string{"--set", "service.apiPort=8080"}, "apiPort"},
		{"apiFrom without apiPort", []string{"--set", "networkPolicy.enabled=true,networkPolicy.ingress.apiFrom[0].podSelector.matchLabels.a=b"}, "apiPort"},
		{"otlp endpoint without a scheme", []string{"--set", "tracing.otlpEndpoint=collector:4318"}, ""},
		{"unknown key in networkPolicy.otlp", []string{"--set", "networkPolicy.otlp.ports[0]=4318"}, "additional properties"},
		{"results size without a number", []string{"--set", "nats.resultsMaxBytes=lots"}, ""},
		{"dead-letter size with a unit Go does not read", []string{"--set", "nats.dlqMaxBytes=1G"}, ""},
		{"negative per-tenant limit", []string{"--set", "nats.resultsMaxPerTenant=-1"}, ""},
		{"fractional per-tenant limit", []string{"--set", "nats.dlqMaxPerTenant=1.5"}, ""},
		{"GOMEMLIMIT with a unit Go does not read", []string{"--set", "goMemLimit=2G"}, ""},
		{"unknown key in the oldest-pending alert", []string{"--set", "prometheusRule.alerts.oldestPending.age=5"}, "additional properties"},
		{"unknown key in the standby-lag alert", []string{"--set", "prometheusRule.alerts.standbyLagging.lag=5"}, "additional properties"},
		{"unknown key in the slot-owner alert", []string{"--set", "prometheusRule.alerts.slotWithoutOwner.threshold=0"}, "additional properties"},
		{"standby-lag threshold not a number", []string{"--set", "prometheusRule.alerts.standbyLagging.threshold=lots"}, ""},
		{"negative standby-lag threshold", []string{"--set", "prometheusRule.alerts.standbyLagging.threshold=-1"}, ""},
		{"unknown key in the worker-down alert", []string{"--set", "prometheusRule.alerts.workerDown.threshold=1"}, "additional properties"},
		{"worker-down for not a duration", []string{"--set", "prometheusRule.alerts.workerDown.for=soon"}, ""},
		{"backlog window not a duration", []string{"--set", "prometheusRule.alerts.backlogGrowing.window=15"}, ""},
		{"backlog window zero", []string{"--set", "prometheusRule.alerts.backlogGrowing.window=0s"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err := helm(templateArgs(tc.args...)...)
			if err == nil {
				t.Fatalf("helm template %v succeeded; the chart must reject it", tc.args)
			}
			if tc.want != "" && !strings.Contains(string(stderr), tc.want) {
				t.Errorf("error does not mention %q:\n%s", tc.want, stderr)
			}
		})
	}
	// The same renders without the bad part succeed, so the failures above
	// come from the bad values and not from something else.
	for _, valid := range []string{
		"replicaCount=16,ownership.mode=static",
		"replicaCount=16,ownership.slots=16,auth.tokensSecret=t",
		"ingress.enabled=true,ingress.host=telha.example.com,auth.tokensSecret=t",
		"ingress.enabled=true,ingress.host=telha.example.com,auth.mode=off",
		"extraVolumes[0].name=x,extraVolumes[0].secret.secretName=s,extraVolumeMounts[0].name=x,extraVolumeMounts[0].mountPath=/x",
		"extraEnv[0].name=TELHA_LOG_LEVEL,extraEnv[0].value=debug",
		"extraEnv[0].name=OTEL_EXPORTER_OTLP_ENDPOINT,extraEnv[0].value=http://c:4318",
		"ownership.mode=static,service.apiPort=8081,networkPolicy.enabled=true,networkPolicy.ingress.apiFrom[0].podSelector.matchLabels.a=b",
		"tracing.otlpEndpoint=https://collector.example.com/v1/traces,networkPolicy.enabled=true",
		"nats.resultsMaxBytes=512MiB,nats.dlqMaxBytes=2GB,nats.resultsMaxPerTenant=0,nats.dlqMaxPerTenant=500",
		"goMemLimit=1500MiB",
		"prometheusRule.enabled=true,prometheusRule.alerts.oldestPending.ageSeconds=60,prometheusRule.alerts.resultsParked.enabled=false",
		"prometheusRule.enabled=true,prometheusRule.alerts.standbyLagging.threshold=500,prometheusRule.alerts.slotWithoutOwner.for=5m",
		"prometheusRule.enabled=true,prometheusRule.alerts.workerDown.for=10m,prometheusRule.alerts.workerDown.severity=warning,prometheusRule.alerts.backlogGrowing.window=10m",
	} {
		if _, stderr, err := helm(templateArgs("--set", valid)...); err != nil {
			t.Errorf("a valid --set %s failed: %v\n%s", valid, err, stderr)
		}
	}
}
