package storage

import "syscall"

// statfsFree returns the bytes available to an unprivileged user on the
// filesystem holding dir.
func statfsFree(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}
