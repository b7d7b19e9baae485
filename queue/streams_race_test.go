package queue

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/testnats"
)

// TestProvisionNoDedupConcurrent: replicas (or processes) that provision
// at once on a fresh install all succeed. One of them seals the sourced
// stream while another, whose cached info still shows it unsealed, purges
// or seals it: the server refuses both (a sealed stream denies purges and
// its deny flags cannot be cleared), and provisioning failed, which made
// the worker exit. Each round provisions a stream that does not exist yet
// (a fresh install of it), from 8 goroutines with a connection each.
func TestProvisionNoDedupConcurrent(t *testing.T) {
	const (
		servers  = 2
		rounds   = 15
		replicas = 8
	)
	for sv := range servers {
		ns := testnats.Start(t)
		jss := make([]jetstream.JetStream, replicas)
		for i := range jss {
			js, err := jetstream.New(testnats.Connect(t, ns.ClientURL()))
			if err != nil {
				t.Fatal(err)
			}
			jss[i] = js
		}
		for round := range rounds {
			c := Config{NoDedupStream: fmt.Sprintf("TELHA_REQ_NODEDUP_%d", round)}.Defaults()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			start := make(chan struct{})
			errs := make([]error, replicas)
			var wg sync.WaitGroup
			for i := range replicas {
				wg.Go(func() {
					<-start
					errs[i] = provisionNoDedup(ctx, jss[i], c)
				})
			}
			close(start)
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("server %d round %d replica %d: %v", sv, round, i, err)
				}
			}
			s, err := jss[0].Stream(ctx, c.NoDedupStream)
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !info.Config.Sealed || info.State.Msgs != 0 {
				t.Fatalf("server %d round %d: %s sealed %v with %d messages", sv, round, c.NoDedupStream, info.Config.Sealed, info.State.Msgs)
			}
			cancel()
			if t.Failed() {
				return
			}
		}
	}
}
