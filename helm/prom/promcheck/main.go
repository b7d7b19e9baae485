// Command promcheck is helm/prom/ci.sh's helper: it turns the chart's
// rendered PrometheusRule into a plain Prometheus rules file, and checks
// the dashboard's queries, the alert expressions and the alerts' states
// against a live Prometheus through its HTTP API.
//
//	promcheck rules < prometheusrule.yaml > rules.yaml
//	promcheck dashboard -url U -dashboard dashboard.json [-rate 1m] [-allow-empty RE]
//	promcheck exprs -url U -rules rules.yaml [-allow-empty RE]
//	promcheck alert -url U -alert NAME [-match k=v,...] -want firing|resolved [-labels k=v,...] [-value V] [-timeout 60s]
//	promcheck quiet -url U [-except RE] [-timeout 60s]
//	promcheck wait -url U -q EXPR [-min 1] [-timeout 60s] [-what TEXT]
//
// Every subcommand prints one line per check ("ok   ..." or "FAIL ...")
// and exits 1 when a check fails.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: promcheck rules|dashboard|exprs|alert|quiet [flags]")
		os.Exit(2)
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "rules":
		err = cmdRules(os.Stdin, os.Stdout)
	case "dashboard":
		err = cmdDashboard(args)
	case "exprs":
		err = cmdExprs(args)
	case "alert":
		err = cmdAlert(args)
	case "quiet":
		err = cmdQuiet(args)
	case "wait":
		err = cmdWait(args)
	default:
		err = fmt.Errorf("unknown command %q", cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "promcheck:", err)
		os.Exit(1)
	}
}

// ---- rules: PrometheusRule -> Prometheus rules file ----

// The fields Prometheus's own rule files take (and nothing else, so that
// `promtool check rules` sees exactly what the operator would load).
type ruleFile struct {
	Groups []ruleGroup `json:"groups"`
}

type ruleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []rule `json:"rules"`
}

type rule struct {
	Record      string            `json:"record,omitempty"`
	Alert       string            `json:"alert,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

func cmdRules(in io.Reader, out io.Writer) error {
	raw, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	// helm template --show-only prints one document after "---" and a
	// "# Source:" comment.
	var docs []string
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(raw), -1) {
		if strings.Contains(d, "kind:") {
			docs = append(docs, d)
		}
	}
	if len(docs) != 1 {
		return fmt.Errorf("want one PrometheusRule document, got %d", len(docs))
	}
	var pr monitoringv1.PrometheusRule
	if err := yaml.UnmarshalStrict([]byte(docs[0]), &pr); err != nil {
		return fmt.Errorf("decode PrometheusRule: %w", err)
	}
	if pr.Kind != "PrometheusRule" {
		return fmt.Errorf("kind %q, want PrometheusRule", pr.Kind)
	}
	var f ruleFile
	for _, g := range pr.Spec.Groups {
		rg := ruleGroup{Name: g.Name}
		if g.Interval != nil {
			rg.Interval = string(*g.Interval)
		}
		for _, r := range g.Rules {
			nr := rule{Record: r.Record, Alert: r.Alert, Expr: r.Expr.String(), Labels: r.Labels, Annotations: r.Annotations}
			if r.For != nil {
				nr.For = string(*r.For)
			}
			rg.Rules = append(rg.Rules, nr)
		}
		f.Groups = append(f.Groups, rg)
	}
	b, err := yaml.Marshal(f)
	if err != nil {
		return err
	}
	_, err = out.Write(b)
	return err
}

// ---- the Prometheus HTTP API ----

type apiResponse struct {
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
	Warnings  []string        `json:"warnings"`
}

var promParser = parser.NewParser(parser.Options{})

var client = &http.Client{Timeout: 10 * time.Second}

func apiGet(base, path string, q url.Values, data any) error {
	resp, err := client.Get(strings.TrimSuffix(base, "/") + path + "?" + q.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var r apiResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return fmt.Errorf("%s: HTTP %d: %.200s", path, resp.StatusCode, body)
	}
	if r.Status != "success" {
		return fmt.Errorf("%s: %s: %s", path, r.ErrorType, r.Error)
	}
	if len(r.Warnings) > 0 {
		return fmt.Errorf("%s: warnings: %s", path, strings.Join(r.Warnings, "; "))
	}
	return json.Unmarshal(r.Data, data)
}

type sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query evaluates expr now; a scalar or string result counts as one series.
func query(base, expr string) ([]sample, error) {
	var d struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := apiGet(base, "/api/v1/query", url.Values{"query": {expr}}, &d); err != nil {
		return nil, err
	}
	switch d.ResultType {
	case "vector":
		var s []sample
		err := json.Unmarshal(d.Result, &s)
		return s, err
	case "scalar", "string":
		var v [2]any
		err := json.Unmarshal(d.Result, &v)
		return []sample{{Value: v}}, err
	default:
		return nil, fmt.Errorf("result type %q", d.ResultType)
	}
}

// selectors returns the vector selectors of expr, as PromQL.
func selectors(expr string) ([]string, error) {
	ast, err := promParser.ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	parser.Inspect(ast, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			s := (&parser.VectorSelector{Name: vs.Name, LabelMatchers: vs.LabelMatchers}).String()
			if !seen[s] {
				seen[s] = true
				out = append(out, s)
			}
		}
		return nil
	})
	return out, nil
}

// checker counts failures and prints one line per check.
type checker struct{ failed int }

func (c *checker) ok(format string, a ...any) { fmt.Printf("ok   "+format+"\n", a...) }
func (c *checker) fail(format string, a ...any) {
	c.failed++
	fmt.Printf("FAIL "+format+"\n", a...)
}
func (c *checker) err() error {
	if c.failed > 0 {
		return fmt.Errorf("%d check(s) failed", c.failed)
	}
	return nil
}

// checkExpr evaluates expr and each of its selectors: the expression must
// evaluate; it and every selector must return series unless allowEmpty
// matches the expression.
func (c *checker) checkExpr(base, what, expr string, allowEmpty *regexp.Regexp) {
	res, err := query(base, expr)
	if err != nil {
		c.fail("%s: %v\n     %s", what, err, expr)
		return
	}
	allowed := allowEmpty != nil && allowEmpty.MatchString(expr)
	sels, err := selectors(expr)
	if err != nil {
		c.fail("%s: parse: %v", what, err)
		return
	}
	var empty []string
	for _, s := range sels {
		r, err := query(base, "count("+s+")")
		if err != nil {
			c.fail("%s: selector %s: %v", what, s, err)
			return
		}
		if len(r) == 0 {
			empty = append(empty, s)
		}
	}
	switch {
	case len(empty) > 0 && !allowed:
		c.fail("%s: no series match %s\n     %s", what, strings.Join(empty, ", "), expr)
	case len(res) == 0 && !allowed && !isAlertExpr(what):
		c.fail("%s: no data\n     %s", what, expr)
	case len(res) == 0 || len(empty) > 0:
		c.ok("%s: evaluates (no data now%s)", what, map[bool]string{true: ", allowed", false: ""}[allowed])
	default:
		c.ok("%s: %d series (e.g. %s)", what, len(res), describe(res[0]))
	}
}

// isAlertExpr: an alert's expression returns nothing while all is well;
// only its selectors must match.
func isAlertExpr(what string) bool { return strings.HasPrefix(what, "alert ") }

func describe(s sample) string {
	var ls []string
	for k, v := range s.Metric {
		if k == "namespace" || k == "pod" || k == "slot" || k == "reason" || k == "op" || k == "status" || k == "role" || k == "version" {
			ls = append(ls, k+"="+v)
		}
	}
	sort.Strings(ls)
	return fmt.Sprintf("{%s} %v", strings.Join(ls, ","), s.Value[1])
}

// ---- dashboard ----

type panel struct {
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
}

type dashboard struct {
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name     string `json:"name"`
			Type     string `json:"type"`
			AllValue string `json:"allValue"`
			Query    any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

var labelValuesRE = regexp.MustCompile(`^\s*label_values\(\s*(.*?)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)

func cmdDashboard(args []string) error {
	fs := flag.NewFlagSet("dashboard", flag.ExitOnError)
	base := fs.String("url", "http://127.0.0.1:9090", "Prometheus")
	file := fs.String("dashboard", "", "dashboard JSON")
	rate := fs.String("rate", "1m", "what $__rate_interval, $__interval and $__range stand for")
	allow := fs.String("allow-empty", "", "regexp of queries that may return no data now")
	fs.Parse(args)
	raw, err := os.ReadFile(*file)
	if err != nil {
		return err
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		return err
	}
	var allowRE *regexp.Regexp
	if *allow != "" {
		allowRE = regexp.MustCompile(*allow)
	}
	c := &checker{}
	// Template variables: each query variable must list values; "All"
	// (allValue) is what the panels are evaluated with.
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q := ""
		switch x := v.Query.(type) {
		case string:
			q = x
		case map[string]any:
			q, _ = x["query"].(string)
		}
		m := labelValuesRE.FindStringSubmatch(q)
		if m == nil {
			c.fail("variable %s: query %q is not label_values(selector, label)", v.Name, q)
			continue
		}
		sel := substitute(m[1], vars, *rate)
		var series []map[string]string
		if err := apiGet(*base, "/api/v1/series", url.Values{"match[]": {sel}}, &series); err != nil {
			c.fail("variable %s: %v", v.Name, err)
			continue
		}
		vals := map[string]bool{}
		for _, s := range series {
			if x, ok := s[m[2]]; ok {
				vals[x] = true
			}
		}
		if len(vals) == 0 {
			c.fail("variable %s: label_values(%s, %s) lists nothing", v.Name, sel, m[2])
		} else {
			c.ok("variable %s: %s", v.Name, strings.Join(sortedKeys(vals), ", "))
		}
		vars[v.Name] = v.AllValue
		if vars[v.Name] == "" {
			vars[v.Name] = ".*"
		}
	}
	var walk func([]panel)
	n := 0
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, t := range p.Targets {
				if t.Expr == "" {
					continue
				}
				n++
				c.checkExpr(*base, fmt.Sprintf("panel %q [%s]", p.Title, t.RefID), substitute(t.Expr, vars, *rate), allowRE)
			}
		}
	}
	walk(d.Panels)
	if n == 0 {
		c.fail("the dashboard has no queries")
	}
	return c.err()
}

var grafanaVarRE = regexp.MustCompile(`\$\{?(__rate_interval|__interval|__range|[a-zA-Z_][a-zA-Z0-9_]*)\}?`)

// substitute replaces Grafana's variables: the interval ones with rate,
// the template ones with their value ("All").
func substitute(expr string, vars map[string]string, rate string) string {
	return grafanaVarRE.ReplaceAllStringFunc(expr, func(m string) string {
		name := strings.Trim(m, "${}")
		if strings.HasPrefix(name, "__") {
			return rate
		}
		if v, ok := vars[name]; ok {
			return v
		}
		return m
	})
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// ---- exprs: every rule's expression against live data ----

func readRules(file string) (ruleFile, error) {
	var f ruleFile
	raw, err := os.ReadFile(file)
	if err != nil {
		return f, err
	}
	err = yaml.UnmarshalStrict(raw, &f)
	return f, err
}

func cmdExprs(args []string) error {
	fs := flag.NewFlagSet("exprs", flag.ExitOnError)
	base := fs.String("url", "http://127.0.0.1:9090", "Prometheus")
	file := fs.String("rules", "", "rules file")
	allow := fs.String("allow-empty", "", "regexp of expressions whose selectors may match nothing")
	fs.Parse(args)
	f, err := readRules(*file)
	if err != nil {
		return err
	}
	var allowRE *regexp.Regexp
	if *allow != "" {
		allowRE = regexp.MustCompile(*allow)
	}
	c := &checker{}
	n := 0
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			n++
			name := r.Alert
			if name == "" {
				name = r.Record
			}
			c.checkExpr(*base, "alert "+name+" ("+*file+")", r.Expr, allowRE)
		}
	}
	if n == 0 {
		c.fail("%s has no rules", *file)
	}
	return c.err()
}

// ---- alert: wait for an alert to fire or resolve ----

type alert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
	Value       string            `json:"value"`
}

func alerts(base string) ([]alert, error) {
	var d struct {
		Alerts []alert `json:"alerts"`
	}
	err := apiGet(base, "/api/v1/alerts", url.Values{}, &d)
	return d.Alerts, err
}

func parseLabels(s string) map[string]string {
	m := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return m
}

func matches(a alert, m map[string]string) bool {
	for k, v := range m {
		if a.Labels[k] != v {
			return false
		}
	}
	return true
}

func cmdAlert(args []string) error {
	fs := flag.NewFlagSet("alert", flag.ExitOnError)
	base := fs.String("url", "http://127.0.0.1:9090", "Prometheus")
	name := fs.String("alert", "", "alert name")
	match := fs.String("match", "", "labels that select the alert instance (k=v,...)")
	want := fs.String("want", "firing", "firing or resolved")
	keyLabels := fs.String("labels", "", "labels the firing alert must carry (k=v,...)")
	value := fs.String("value", "", "the value the firing alert must have (a number), if set")
	timeout := fs.Duration("timeout", time.Minute, "deadline")
	fs.Parse(args)
	sel := parseLabels(*match)
	sel["alertname"] = *name
	start := time.Now()
	deadline := start.Add(*timeout)
	var last []alert
	var lastErr error
	for {
		as, err := alerts(*base)
		lastErr = err
		if err == nil {
			var firing []alert
			for _, a := range as {
				if matches(a, sel) && a.State == "firing" {
					firing = append(firing, a)
				}
			}
			last = firing
			if *want == "firing" && len(firing) > 0 {
				return checkFiring(firing[0], *name, parseLabels(*keyLabels), *value, time.Since(start))
			}
			if *want == "resolved" && len(firing) == 0 {
				fmt.Printf("ok   alert %s%s resolved after %.1fs\n", *name, fmtLabels(sel), time.Since(start).Seconds())
				return nil
			}
		}
		if time.Now().After(deadline) {
			fmt.Printf("FAIL alert %s%s not %s within %s (firing: %v; last error: %v)\n", *name, fmtLabels(sel), *want, *timeout, last, lastErr)
			return errors.New("timeout")
		}
		time.Sleep(500 * time.Millisecond) // polling with a deadline
	}
}

// checkFiring checks what a firing alert tells: the key labels, a summary
// and a description with their templates expanded, and a runbook link to
// the alert's own section.
func checkFiring(a alert, name string, key map[string]string, value string, took time.Duration) error {
	var bad []string
	if value != "" { // the API prints values as 2e+00
		got, err1 := strconv.ParseFloat(a.Value, 64)
		want, err2 := strconv.ParseFloat(value, 64)
		if err1 != nil || err2 != nil || got != want {
			bad = append(bad, fmt.Sprintf("value %s, want %s", a.Value, value))
		}
	}
	for k, v := range key {
		if a.Labels[k] != v {
			bad = append(bad, fmt.Sprintf("label %s=%q, want %q", k, a.Labels[k], v))
		}
	}
	for _, k := range []string{"summary", "description"} {
		v := a.Annotations[k]
		if v == "" || strings.Contains(v, "<no value>") || strings.Contains(v, "{{") || strings.Contains(v, "%!") {
			bad = append(bad, fmt.Sprintf("annotation %s=%q", k, v))
		}
	}
	if rb := a.Annotations["runbook_url"]; !strings.HasSuffix(rb, "#"+strings.ToLower(name)) {
		bad = append(bad, fmt.Sprintf("runbook_url %q does not end in #%s", rb, strings.ToLower(name)))
	}
	if len(bad) > 0 {
		fmt.Printf("FAIL alert %s%s fires but: %s\n", name, fmtLabels(a.Labels), strings.Join(bad, "; "))
		return errors.New("bad alert")
	}
	fmt.Printf("ok   alert %s%s firing after %.1fs (value %s): %s\n", name, fmtLabels(a.Labels), took.Seconds(), a.Value, a.Annotations["summary"])
	return nil
}

func fmtLabels(m map[string]string) string {
	var ls []string
	for k, v := range m {
		if k == "alertname" {
			continue
		}
		ls = append(ls, k+"="+v)
	}
	sort.Strings(ls)
	return "{" + strings.Join(ls, ",") + "}"
}

// ---- quiet: no alert firing (but the excepted ones) ----

func cmdQuiet(args []string) error {
	fs := flag.NewFlagSet("quiet", flag.ExitOnError)
	base := fs.String("url", "http://127.0.0.1:9090", "Prometheus")
	except := fs.String("except", "", "regexp of alert names that may fire")
	timeout := fs.Duration("timeout", time.Minute, "deadline")
	fs.Parse(args)
	var exceptRE *regexp.Regexp
	if *except != "" {
		exceptRE = regexp.MustCompile("^(" + *except + ")$")
	}
	start := time.Now()
	var firing []string
	for {
		as, err := alerts(*base)
		if err == nil {
			firing = firing[:0]
			for _, a := range as {
				if a.State == "firing" && (exceptRE == nil || !exceptRE.MatchString(a.Labels["alertname"])) {
					firing = append(firing, a.Labels["alertname"]+fmtLabels(a.Labels))
				}
			}
			if len(firing) == 0 {
				fmt.Printf("ok   no alert firing (after %.1fs)\n", time.Since(start).Seconds())
				return nil
			}
		}
		if time.Since(start) > *timeout {
			fmt.Printf("FAIL alerts still firing after %s: %s (error: %v)\n", *timeout, strings.Join(firing, " "), err)
			return errors.New("timeout")
		}
		time.Sleep(500 * time.Millisecond) // polling with a deadline
	}
}

// ---- wait: until a query returns at least min series ----

func cmdWait(args []string) error {
	fs := flag.NewFlagSet("wait", flag.ExitOnError)
	base := fs.String("url", "http://127.0.0.1:9090", "Prometheus")
	q := fs.String("q", "", "PromQL")
	min := fs.Int("min", 1, "series wanted")
	what := fs.String("what", "", "what is waited for (the report's text)")
	timeout := fs.Duration("timeout", time.Minute, "deadline")
	fs.Parse(args)
	if *what == "" {
		*what = *q
	}
	start := time.Now()
	var n int
	var err error
	for {
		var res []sample
		res, err = query(*base, *q)
		n = len(res)
		if err == nil && n >= *min {
			fmt.Printf("ok   %s (%d series, after %.1fs)\n", *what, n, time.Since(start).Seconds())
			return nil
		}
		if time.Since(start) > *timeout {
			fmt.Printf("FAIL %s: %d series of %d within %s (error: %v)\n     %s\n", *what, n, *min, *timeout, err, *q)
			return errors.New("timeout")
		}
		time.Sleep(500 * time.Millisecond) // polling with a deadline
	}
}
