package chartcheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestDockerfile checks the repository's Dockerfile statically (no Docker
// engine is available where the tests run) and that the image and the
// chart agree on the user, the data directory and the port.
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "Dockerfile"))
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	df := string(b)
	var stages []string
	for _, line := range strings.Split(df, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && strings.EqualFold(f[0], "FROM") {
			stages = append(stages, line)
		}
	}
	if len(stages) != 2 {
		t.Fatalf("want a two-stage build, got FROM lines %q", stages)
	}
	if !strings.Contains(stages[0], "golang:") || !regexp.MustCompile(`ARG GO_VERSION=1\.26\b`).MatchString(df) {
		t.Errorf("builder must be golang:1.26: %q", stages[0])
	}
	if !strings.Contains(stages[1], "gcr.io/distroless/static:nonroot") {
		t.Errorf("final stage must be distroless/static:nonroot: %q", stages[1])
	}
	for _, want := range []string{
		"CGO_ENABLED=0",
		"-trimpath",
		"-X main.version=${VERSION}",
		"-X main.revision=${REVISION}",
		"-o /out/telha-worker ./cmd/worker",
		"-o /out/telha-enqueue ./cmd/enqueue",
		"COPY --from=build /out/telha-worker /telha-worker",
		`VOLUME ["/data"]`,
		"EXPOSE 8080",
		`ENTRYPOINT ["/telha-worker"]`,
		`CMD ["--data-dir=/data"]`,
	} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	user := regexp.MustCompile(`(?m)^USER\s+(\d+)(?::(\d+))?\s*$`).FindStringSubmatch(df)
	if user == nil {
		t.Fatal("Dockerfile needs a numeric USER")
	}

	// The chart runs the same uid, mounts /data and serves on 8080.
	vb, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		PodSecurityContext struct {
			RunAsUser int `json:"runAsUser"`
		} `json:"podSecurityContext"`
		Service struct {
			Port int `json:"port"`
		} `json:"service"`
	}
	if err := yaml.Unmarshal(vb, &values); err != nil {
		t.Fatal(err)
	}
	if user[1] != strconv.Itoa(values.PodSecurityContext.RunAsUser) {
		t.Errorf("image USER %s but chart runAsUser %d", user[1], values.PodSecurityContext.RunAsUser)
	}
	if values.Service.Port != 8080 {
		t.Errorf("chart port %d, image exposes 8080", values.Service.Port)
	}

	// The linker flags name variables that exist.
	if src, err := os.ReadFile(filepath.Join("..", "cmd", "worker", "main.go")); err == nil {
		if !regexp.MustCompile(`\bvar\s+(version\s*,\s*revision|\(\s*version\b)|\bversion\s*,\s*revision\s+string\b`).Match(src) {
			t.Errorf("cmd/worker/main.go has no package-level version/revision variables for -X main.version/main.revision")
		}
	}

	// .dockerignore must not drop what the build needs.
	if ib, err := os.ReadFile(filepath.Join("..", ".dockerignore")); err == nil {
		for _, line := range strings.Split(string(ib), "\n") {
			l := strings.TrimSpace(line)
			switch l {
			case "go.mod", "go.sum", "cmd", "cmd/worker", "cmd/enqueue", "*", "**/*.go", "*.go":
				t.Errorf(".dockerignore excludes %q, which the build needs", l)
			}
		}
	} else {
		t.Errorf(".dockerignore: %v", err)
	}
}
