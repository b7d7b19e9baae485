package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/queue/client"
)

// runDemo builds a small social graph with one super-node (a hub with
// enough edges to take the journaled path at the default max_batch_ops of
// 100000), then deletes an edge, a person and the hub, and tells the user
// how to look at the result: each delete's result as a JSON line on
// stdout, then HUB= and BEFORE= lines to paste into a shell.
func runDemo(ctx context.Context, g *globals, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tenant := fs.String("tenant", "demo", "tenant")
	people := fs.Int("people", 200, "person nodes")
	hubEdges := fs.Int("hub-edges", 20_001, "edges of the hub (20001*5+3 puts > 100000: journaled)")
	all := fs.Bool("all-results", false, "print every result as a JSON line (default: the deletes' results only)")
	httpAddr := fs.String("http", "http://localhost:8080", "the worker's HTTP address, for the hints printed at the end")
	if _, err := parseSub(fs, g, args); err != nil {
		return err
	}
	if *people < 2 || *hubEdges < 1 {
		return usageError{"demo needs --people >= 2 and --hub-edges >= 1"}
	}
	nc, c, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	mk := func(body map[string]any) request {
		id := uuid.NewString()
		body["request_id"] = id
		body["tenant"] = *tenant
		body["provenance"] = map[string]string{"actor": "demo", "source": "enqueue demo"}
		b, _ := client.Marshal(body)
		return request{tenant: *tenant, id: id, body: b}
	}
	phase := func(name string, reqs []request) (map[string]client.Result, error) {
		start := time.Now()
		fmt.Fprintf(stderr, "%-34s %6d requests ... ", name, len(reqs))
		got, err := publishAll(ctx, g, c, reqs, true, nil, stderr, nil)
		if err != nil {
			fmt.Fprintln(stderr)
			return nil, err
		}
		counts := map[string]int{}
		for _, r := range got {
			counts[r.Status]++
		}
		fmt.Fprintf(stderr, "done in %s %v\n", time.Since(start).Round(time.Millisecond), counts)
		if *all || len(reqs) <= 10 {
			printResults(stdout, reqs, got)
		}
		return got, nil
	}

	hub := uuid.NewString()
	persons := make([]string, *people)
	nodes := []request{mk(map[string]any{"op": "put_node", "id": hub, "props": map[string]any{"name": "everyone"}})}
	for i := range persons {
		persons[i] = uuid.NewString()
		nodes = append(nodes, mk(map[string]any{"op": "put_node", "id": persons[i], "props": map[string]any{"name": fmt.Sprintf("person-%d", i)}}))
	}
	if _, err := phase("1/4 put nodes", nodes); err != nil {
		return err
	}
	var edges []request
	var knows []string
	for i := 0; i < *hubEdges; i++ {
		edges = append(edges, mk(map[string]any{"op": "put_edge", "id": uuid.NewString(), "src": hub, "dst": persons[i%len(persons)], "label": "includes"}))
	}
	for i := 0; i+1 < len(persons); i += 2 {
		id := uuid.NewString()
		knows = append(knows, id)
		edges = append(edges, mk(map[string]any{"op": "put_edge", "id": id, "src": persons[i], "dst": persons[i+1], "label": "knows"}))
	}
	if _, err := phase("2/4 put edges (hub + knows)", edges); err != nil {
		return err
	}
	hubDel := mk(map[string]any{"op": "tombstone_node", "id": hub})
	got, err := phase("3/4 delete the hub (journaled)", []request{hubDel})
	if err != nil {
		return err
	}
	dels := []request{
		mk(map[string]any{"op": "tombstone_edge", "id": knows[0]}),
		mk(map[string]any{"op": "tombstone_node", "id": persons[2]}),
	}
	if _, err := phase("4/4 delete an edge and a person", dels); err != nil {
		return err
	}
	res := got[hubDel.id]
	if res.Status != client.StatusOK {
		return fmt.Errorf("hub delete: %s %s", res.Status, res.Error)
	}
	// BEFORE is one microsecond (the tx clock's grain) below the delete's
	// own tx: the last coordinate at which the hub and its edges are live.
	// The delete's tx itself already reads the tombstone (404).
	tx, err := time.Parse(time.RFC3339Nano, res.TxTime)
	if err != nil {
		return fmt.Errorf("hub delete result: tx_time %q: %w", res.TxTime, err)
	}
	beforeTx := tx.Add(-time.Microsecond).UTC().Format("2006-01-02T15:04:05.000000Z07:00")
	fmt.Fprintf(stderr, `
The hub %s is deleted (%d edges tombstoned, journaled=%v, at tx %s).
It reads absent now, and live as of one microsecond before its delete.
Paste these two lines into your shell, then the README's curl commands:

`, hub, res.EdgesTombstoned, res.Journaled, res.TxTime)
	// The two lines a user pastes go to stdout too, after the results, so
	// `eval "$(enqueue demo | grep -E '^(HUB|BEFORE)=')"` works.
	fmt.Fprintf(stdout, "HUB=%s\nBEFORE=%s\n", hub, beforeTx)
	fmt.Fprintf(stderr, `
  curl -s %[1]s/v1/tenants/%[2]s/nodes/$HUB                          # 404: deleted
  curl -s "%[1]s/v1/tenants/%[2]s/nodes/$HUB?tx=$BEFORE"             # 200: as of before
  curl -s "%[1]s/v1/tenants/%[2]s/nodes/$HUB/edges?tx=$BEFORE" | head -c 400
  curl -s %[1]s/v1/tenants/%[2]s/nodes/$HUB/history
  curl -s %[1]s/metrics | grep ^telha_cascade
`, *httpAddr, *tenant)
	return nil
}

// printResults writes the results of reqs as JSON lines, in request order.
func printResults(w io.Writer, reqs []request, got map[string]client.Result) {
	enc := json.NewEncoder(w)
	for _, r := range reqs {
		if res, ok := got[r.id]; ok {
			_ = enc.Encode(res)
		}
	}
}
