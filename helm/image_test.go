package chartcheck

import (
	"archive/tar"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestImage checks the image tarball that ci.sh builds with
// cmd/build-image (TELHA_IMAGE_TAR): non-root, the worker as entrypoint,
// /data owned by the runtime user, and a binary that runs.
func TestImage(t *testing.T) {
	path := os.Getenv("TELHA_IMAGE_TAR")
	if path == "" {
		t.Skip("TELHA_IMAGE_TAR not set (helm/ci.sh builds the image and sets it)")
	}
	img, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if c.User != "65532:65532" || len(c.Entrypoint) != 1 || c.Entrypoint[0] != "/telha-worker" || cf.OS != "linux" {
		t.Fatalf("config %+v", c)
	}
	if _, ok := c.Volumes["/data"]; !ok {
		t.Fatal("no /data volume")
	}
	if _, ok := c.ExposedPorts["8080/tcp"]; !ok {
		t.Fatal("port 8080 not exposed")
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	dir := t.TempDir()
	seen := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		seen[strings.TrimSuffix(h.Name, "/")] = h
		if h.Name == "telha-worker" {
			f, err := os.OpenFile(filepath.Join(dir, "telha-worker"), os.O_CREATE|os.O_WRONLY, 0o755)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
	}
	for _, p := range []string{"telha-worker", "telha-enqueue", "data", "etc/passwd"} {
		if seen[p] == nil {
			t.Fatalf("%s missing from the image", p)
		}
	}
	if seen["telha-worker"].Mode&0o111 == 0 {
		t.Fatal("worker not executable")
	}
	if seen["data"].Uid != 65532 {
		t.Fatalf("/data owned by %d, want 65532", seen["data"].Uid)
	}
	out, err := exec.Command(filepath.Join(dir, "telha-worker"), "-h").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "-partition-owner") {
		t.Fatalf("the image's worker does not run: %v\n%s", err, out)
	}
}
