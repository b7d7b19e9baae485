package diskscan

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
)

// FilesContaining returns the files under dir (paths relative to it) whose
// bytes contain s.
func FilesContaining(dir, s string) ([]string, error) {
	var hits []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if bytes.Contains(b, []byte(s)) {
			rel, _ := filepath.Rel(dir, p)
			hits = append(hits, rel)
		}
		return nil
	})
	return hits, err
}
