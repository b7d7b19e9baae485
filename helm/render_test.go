package chartcheck

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

const (
	chartDir    = "telha-cascade"
	releaseName = "telha"
	namespace   = "graph"
	// fullname is what the chart names its objects for releaseName.
	fullname = "telha-telha-cascade"
)

// render is one `helm template` output: the values file it used ("" for
// the chart defaults) and its objects.
type render struct {
	name    string // "chart-defaults", or the ci file's base name without -values.yaml
	values  string
	objects []runtime.Object
}

var (
	decoderOnce sync.Once
	decoder     runtime.Decoder
)

// strictDecoder decodes YAML or JSON into the client-go scheme plus the
// prometheus-operator monitoring/v1 types, failing on unknown, duplicate
// and wrong-case fields.
func strictDecoder(t testing.TB) runtime.Decoder {
	t.Helper()
	decoderOnce.Do(func() {
		s := runtime.NewScheme()
		if err := scheme.AddToScheme(s); err != nil {
			panic(err)
		}
		if err := monitoringv1.AddToScheme(s); err != nil {
			panic(err)
		}
		decoder = serializer.NewCodecFactory(s, serializer.EnableStrict).UniversalDeserializer()
	})
	return decoder
}

// helm runs the Helm CLI: $HELM_BIN when set (ci.sh builds it once),
// otherwise `go tool helm` from this module.
func helm(args ...string) (stdout, stderr []byte, err error) {
	var cmd *exec.Cmd
	if bin := os.Getenv("HELM_BIN"); bin != "" {
		cmd = exec.Command(bin, args...)
	} else {
		cmd = exec.Command("go", append([]string{"tool", "helm"}, args...)...)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.Bytes(), errb.Bytes(), err
}

func templateArgs(extra ...string) []string {
	return append([]string{"template", releaseName, "./" + chartDir, "--namespace", namespace}, extra...)
}

// ciValuesFiles lists the chart's ci/*-values.yaml files.
func ciValuesFiles(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no ci/*-values.yaml files")
	}
	sort.Strings(files)
	return files
}

func renderName(valuesFile string) string {
	if valuesFile == "" {
		return "chart-defaults"
	}
	return strings.TrimSuffix(filepath.Base(valuesFile), "-values.yaml")
}

var (
	rendersOnce sync.Once
	renders     []*render
	rendersErr  error
)

// allRenders returns the chart rendered with its defaults and with every
// ci values file. With TELHA_RENDER_DIR set (by ci.sh) it reads
// <dir>/<name>.yaml; otherwise it runs `helm template` itself.
func allRenders(t testing.TB) []*render {
	t.Helper()
	rendersOnce.Do(func() {
		inputs := append([]string{""}, ciValuesFiles(t)...)
		dir := os.Getenv("TELHA_RENDER_DIR")
		for _, vf := range inputs {
			r := &render{name: renderName(vf), values: vf}
			var data []byte
			if dir != "" {
				p := filepath.Join(dir, r.name+".yaml")
				b, err := os.ReadFile(p)
				if err != nil {
					rendersErr = fmt.Errorf("TELHA_RENDER_DIR is set but %s is missing: %w", p, err)
					return
				}
				data = b
			} else {
				var extra []string
				if vf != "" {
					extra = []string{"-f", vf}
				}
				out, errb, err := helm(templateArgs(extra...)...)
				if err != nil {
					rendersErr = fmt.Errorf("helm template (%s): %v\n%s", r.name, err, errb)
					return
				}
				data = out
			}
			objs, err := decodeAll(strictDecoder(t), data)
			if err != nil {
				rendersErr = fmt.Errorf("render %s: %w", r.name, err)
				return
			}
			r.objects = objs
			renders = append(renders, r)
		}
	})
	if rendersErr != nil {
		t.Fatal(rendersErr)
	}
	return renders
}

func renderByName(t testing.TB, name string) *render {
	t.Helper()
	for _, r := range allRenders(t) {
		if r.name == name {
			return r
		}
	}
	t.Fatalf("no render named %q", name)
	return nil
}

// splitDocuments splits a multi-document YAML stream and drops documents
// that hold only comments or whitespace.
func splitDocuments(data []byte) ([][]byte, error) {
	rd := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := rd.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		if isBlankDoc(doc) {
			continue
		}
		docs = append(docs, doc)
	}
}

func isBlankDoc(doc []byte) bool {
	for _, line := range strings.Split(string(doc), "\n") {
		l := strings.TrimSpace(line)
		if l != "" && !strings.HasPrefix(l, "#") && l != "---" {
			return false
		}
	}
	return true
}

func decodeAll(dec runtime.Decoder, data []byte) ([]runtime.Object, error) {
	docs, err := splitDocuments(data)
	if err != nil {
		return nil, err
	}
	if len(docs) == 0 {
		return nil, errors.New("no objects rendered")
	}
	var objs []runtime.Object
	for i, doc := range docs {
		obj, gvk, err := dec.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("document %d (%s): strict decode: %w\n%s", i, sourceOf(doc), err, doc)
		}
		if gvk == nil || gvk.Kind == "" {
			return nil, fmt.Errorf("document %d (%s): no kind", i, sourceOf(doc))
		}
		objs = append(objs, obj)
	}
	return objs, nil
}

func sourceOf(doc []byte) string {
	for _, line := range strings.Split(string(doc), "\n") {
		if s, ok := strings.CutPrefix(strings.TrimSpace(line), "# Source: "); ok {
			return s
		}
	}
	return "?"
}

// objectsOf returns the render's objects of type T.
func objectsOf[T runtime.Object](r *render) []T {
	var out []T
	for _, o := range r.objects {
		if v, ok := o.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func oneOf[T runtime.Object](t *testing.T, r *render) T {
	t.Helper()
	objs := objectsOf[T](r)
	if len(objs) != 1 {
		var zero T
		t.Fatalf("render %s: want exactly one %T, got %d", r.name, zero, len(objs))
	}
	return objs[0]
}
