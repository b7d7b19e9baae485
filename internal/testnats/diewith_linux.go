//go:build linux

package testnats

import (
	"os/exec"
	"syscall"
)

// DieWithParent makes cmd's process get SIGKILL when the test process
// ends, however it ends (a -timeout panic or a SIGTERM runs no Cleanup):
// an orphaned nats-server or worker would otherwise go on using the CPU
// of every test after it.
func DieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
