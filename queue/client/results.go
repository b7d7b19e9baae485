package client

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Recent results (issue 23 item 9): the results stream read newest first,
// a page at a time, for the status page's list of recent requests (as
// River UI and asynqmon list jobs by state). Like the dead letters, a page
// costs O(its size): tenants are selected by subject on the server
// (<prefix>.res.<tenant>), and a status filter (the status is in the body)
// reads at most scanPerPage pages' worth before giving a Next to go on
// from.

// StoredResult is one message of the results stream.
type StoredResult struct {
	Result
	Seq  uint64
	Time time.Time
	// Unreadable: the body is not a result (Result is then empty).
	Unreadable bool
}

// ResultFilter selects results (empty fields select all).
type ResultFilter struct {
	Tenant, Status string
	// Tenants, when not nil, keeps only these tenants ("*" keeps all).
	Tenants []string
	Limit   int    // at most this many, newest first (0: 50)
	Before  uint64 // when not 0: below this stream sequence (the previous page's Next)
}

// ResultPage is a page of results, newest first.
type ResultPage struct {
	Results []StoredResult
	// Next is the Before of the next (older) page; 0 when there is none.
	Next uint64
	// Read is how many messages were fetched from the server.
	Read int
}

// ResultStream reads a results stream by name (TELHA_RES).
type ResultStream struct {
	JS     jetstream.JetStream
	Stream string // TELHA_RES
	Prefix string // telha
}

// List returns a page of results, newest first.
func (r ResultStream) List(ctx context.Context, f ResultFilter) (ResultPage, error) {
	var page ResultPage
	s, err := r.JS.Stream(ctx, r.Stream)
	if err != nil {
		return page, err
	}
	if f.Limit <= 0 {
		f.Limit = 50
	}
	subjects := tenantSubjects(r.Prefix+".res.", f.Tenant, f.Tenants)
	if len(subjects) == 0 {
		return page, nil
	}
	info, err := s.Info(ctx)
	if err != nil {
		return page, err
	}
	page.Next, page.Read, err = newestPage(ctx, s, subjects, info, f.Before, f.Limit, f.Status != "", func(m *jetstream.RawStreamMsg) bool {
		sr := StoredResult{Seq: m.Sequence, Time: m.Time}
		if json.Unmarshal(m.Data, &sr.Result) != nil {
			sr.Result, sr.Unreadable = Result{}, true
		}
		if f.Status != "" && sr.Status != f.Status {
			return false
		}
		page.Results = append(page.Results, sr)
		return true
	})
	return page, err
}
