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
	if _, stderr, err := helm(templateArgs("--set", "replicaCount=16")...); err != nil {
		t.Fatalf("a valid --set failed: %v\n%s", err, stderr)
	}
}
