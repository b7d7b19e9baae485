package api

import "github.com/google/uuid"

// SetWalkHook sets the edge walk's test hook (see walkHook) until the
// returned func is called.
func SetWalkHook(f func(other uuid.UUID)) (restore func()) {
	walkHook.Store(&f)
	return func() { walkHook.Store(nil) }
}
