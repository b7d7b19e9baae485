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
// how to look at the result.
func runDemo(ctx context.Context, g *globals, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tenant := fs.String("tenant", "demo", "tenant")
	people := fs.Int("people", 200, "person nodes")
	hubEdges := fs.Int("hub-edges", 20_001, "edges of the hub (20001*5+3 puts > 100000: journaled)")
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
		b, _ := json.Marshal(body)
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
	before := time.Now().UTC()
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
	_ = json.NewEncoder(stdout).Encode(res)
	asOf := before.Format(time.RFC3339Nano)
	fmt.Fprintf(stderr, `
The hub %s is deleted (%d edges tombstoned, journaled=%v, tx %s).
Now it reads absent, and as of before the delete it is still there:

  curl -s %s/v1/tenants/%s/nodes/%s                      # 404
  curl -s '%s/v1/tenants/%s/nodes/%s?tx=%s'    # 200
  curl -s '%s/v1/tenants/%s/nodes/%s/edges?tx=%s' | head -c 300
  curl -s %s/v1/tenants/%s/nodes/%s/history
  curl -s %s/metrics | grep ^telha_cascade
`, hub, res.EdgesTombstoned, res.Journaled, res.TxTime,
		*httpAddr, *tenant, hub, *httpAddr, *tenant, hub, asOf, *httpAddr, *tenant, hub, asOf, *httpAddr, *tenant, hub, *httpAddr)
	if res.Status != client.StatusOK {
		return fmt.Errorf("hub delete: %s %s", res.Status, res.Error)
	}
	return nil
}
