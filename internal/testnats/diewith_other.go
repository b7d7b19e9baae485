//go:build !linux

package testnats

import "os/exec"

// DieWithParent does nothing here: only Linux has a parent-death signal.
func DieWithParent(cmd *exec.Cmd) {}
