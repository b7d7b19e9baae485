package diskscan

import (
	"bytes"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
)

// FilesContaining returns the files under dir (paths relative to it) whose
// bytes contain s. A file (or directory) deleted between the listing and
// its read holds nothing any more and is skipped: a store scanned while
// it runs deletes its obsolete files (Pebble's OPTIONS and tables) in the
// background, and a CI run failed on an OPTIONS file gone so.
func FilesContaining(dir, s string) ([]string, error) {
	var hits []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p != dir {
				return nil
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
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

// Marker returns prefix followed by 12 random letters from G to Z: a
// string to find on disk. Pebble compresses its tables (Snappy), and a
// compressor writes a run of 4 or more bytes it has seen earlier in the
// block as a back-reference: a marker of hex digits (a uuid's) can share
// such a run with the uuids around it and so be missing from the file
// byte by byte while its row is there. No hex digit, key or JSON name of
// the store is made of these letters, so a marker stays whole where it is
// stored.
func Marker(prefix string) string {
	b := []byte(prefix)
	for range 12 {
		b = append(b, byte('G'+rand.IntN(20)))
	}
	return string(b)
}
