// Command build-image builds the worker's container image without a
// container engine: static Go binaries (CGO_ENABLED=0) in one layer on an
// empty base, configured like the Dockerfile (non-root uid 65532,
// entrypoint /telha-worker, /data volume, port 8080), written as a
// docker-loadable tarball (`docker load -i`, `crane push`, `skopeo copy
// docker-archive:...`). CI builds it and tests it (image_test.go).
//
//	go run ./cmd/build-image -repo .. -out telha-cascade.tar [-tag telha/telha-cascade:dev]
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	repo := flag.String("repo", "..", "repository root (holds go.mod of the worker)")
	out := flag.String("out", "telha-cascade.tar", "image tarball to write")
	tag := flag.String("tag", "telha/telha-cascade:dev", "image reference recorded in the tarball")
	version := flag.String("version", "dev", "version stamped into the binaries")
	revision := flag.String("revision", "unknown", "revision stamped into the binaries")
	arch := flag.String("arch", "amd64", "GOARCH of the image")
	flag.Parse()
	if err := build(*repo, *out, *tag, *version, *revision, *arch); err != nil {
		fmt.Fprintln(os.Stderr, "build-image:", err)
		os.Exit(1)
	}
}

func build(repo, out, tag, version, revision, arch string) error {
	tmp, err := os.MkdirTemp("", "telha-image")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	ldflags := fmt.Sprintf("-s -w -X main.version=%s -X main.revision=%s", version, revision)
	bins := map[string]string{"telha-worker": "./cmd/worker", "telha-enqueue": "./cmd/enqueue"}
	for bin, pkg := range bins {
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", ldflags, "-o", filepath.Join(tmp, bin), pkg)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOFLAGS=-buildvcs=false")
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(0, 0)
	dir := func(path string, uid int) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: path + "/", Mode: 0o755, Uid: uid, Gid: uid, ModTime: mtime})
	}
	file := func(path string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: path, Mode: mode, Size: int64(len(data)), ModTime: mtime}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := dir("data", 65532); err != nil {
		return err
	}
	if err := dir("tmp", 0); err != nil {
		return err
	}
	if err := dir("etc", 0); err != nil {
		return err
	}
	// A passwd entry so the uid has a name (and a home) for tools that ask.
	if err := file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/data:/sbin/nologin\n")); err != nil {
		return err
	}
	if err := file("etc/group", 0o644, []byte("root:x:0:\nnonroot:x:65532:\n")); err != nil {
		return err
	}
	// CA roots for TLS to a NATS server with a public certificate.
	if ca, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt"); err == nil {
		if err := dir("etc/ssl", 0); err != nil {
			return err
		}
		if err := dir("etc/ssl/certs", 0); err != nil {
			return err
		}
		if err := file("etc/ssl/certs/ca-certificates.crt", 0o644, ca); err != nil {
			return err
		}
	}
	for _, bin := range []string{"telha-worker", "telha-enqueue"} {
		b, err := os.ReadFile(filepath.Join(tmp, bin))
		if err != nil {
			return err
		}
		if err := file(bin, 0o755, b); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layerBytes := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerBytes)), nil })
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", arch, v1.Time{Time: mtime}
	cf.Config.User = "65532:65532"
	cf.Config.Entrypoint = []string{"/telha-worker"}
	cf.Config.Cmd = []string{"--data-dir=/data"}
	cf.Config.Env = []string{"PATH=/", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"}
	cf.Config.WorkingDir = "/data"
	cf.Config.ExposedPorts = map[string]struct{}{"8080/tcp": {}}
	cf.Config.Volumes = map[string]struct{}{"/data": {}}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":    "telha-cascade",
		"org.opencontainers.image.source":   "https://github.com/telha/telha-cascade",
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.revision": revision,
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return err
	}
	ref, err := name.NewTag(tag)
	if err != nil {
		return err
	}
	if err := tarball.WriteToFile(out, ref, img); err != nil {
		return err
	}
	d, _ := img.Digest()
	fmt.Printf("wrote %s (%s, %s, %d MiB layer)\n", out, strings.TrimPrefix(ref.String(), "index.docker.io/"), d, len(layerBytes)>>20)
	return nil
}
