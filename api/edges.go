package api

import (
	"sync/atomic"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
)

// walkHook, when set (tests), runs inside an edge walk for each neighbour,
// after the walk's iterator took its view and before the neighbour's fence
// is checked: the moment a journal finishing must not be missed.
var walkHook atomic.Pointer[func(other uuid.UUID)]

// SafeEdgesPage reads a page of node's edges at (v, t), t <= the committed
// tx, as storage.EdgesOfPage does, unless an edge leads to a neighbour a
// journal with tx <= t fences (its chunks may still land at or below t):
// then it returns that journal and no page, and the caller waits for it or
// reads again below its tx.
//
// The fences are taken before the walk's iterator takes its view: a
// journal that finishes during the walk (its fence dropped) was in force
// when the view was taken, so its last chunks may be missing from the
// view; it still blocks the page, and the caller's next walk (whose view
// has them) reads the neighbour's edges as they are. A journal registered
// after that moment has a tx above the committed tx the read was answered
// at, so it cannot write at or below t. The fences are the registry's
// own (Journals.FencesUpTo), with the journals whose head has committed
// but is not yet marked so: the committed tx passes a journal's tx before
// the mark.
func SafeEdgesPage(st *storage.Store, sc storage.Scope, node uuid.UUID, dir storage.Direction, v, t storage.Ts,
	after *storage.EdgeCursor, limit, scanLimit int) (storage.EdgesPage, *storage.JournalEntry, error) {
	fenced := st.Journals().FencesUpTo(sc, t)
	hook := walkHook.Load()
	var blocked *storage.JournalEntry
	page, err := storage.EdgesOfPage(st.Reader(), sc, node, dir, v, t, after, limit, scanLimit, func(other uuid.UUID) bool {
		if hook != nil {
			(*hook)(other)
		}
		if e := fenced[other]; e != nil {
			blocked = e
			return false
		}
		if _, by := st.SafeAt(sc, t, other); by != nil {
			blocked = by
			return false
		}
		return true
	})
	if blocked != nil {
		return storage.EdgesPage{}, blocked, nil
	}
	return page, nil, err
}
