package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/telha/telha-cascade/queue/client"
)

// runPause is `enqueue pause` and `enqueue resume` (issue 23 item 12): the
// durable consumer of a replica (or of every replica) is paused with
// JetStream's consumer pause, so no worker consuming it takes a request
// until it is resumed or the pause runs out; a worker restart keeps the
// pause. It prints one JSON line per consumer: {"consumer", "paused",
// "until"}.
func runPause(ctx context.Context, g *globals, cmd string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	stream := fs.String("stream", client.ReqStream, "the request stream")
	replica := fs.Int("replica", -1, "the replica (slot) whose consumer (telha-worker-<replica>) to "+cmd+" (required unless --all)")
	fs.IntVar(replica, "slot", -1, "the same as --replica: a slot of --partition-owner dynamic/N is replica i/N's consumer")
	all := fs.Bool("all", false, cmd+" every replica's consumer (telha-worker-*)")
	var forDur time.Duration
	if cmd == "pause" {
		fs.DurationVar(&forDur, "for", 0, "pause: how long (1h, 30m); 0: until resumed")
	}
	pos, err := parseConn(fs, g, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return usageError{fmt.Sprintf("%s takes no arguments (--replica N, --slot N or --all)", cmd)}
	case *all == (*replica >= 0):
		return usageError{fmt.Sprintf("%s needs one of --replica N (or --slot N) or --all (enqueue owner --tenant T names a tenant's replica or slot)", cmd)}
	case forDur < 0:
		return usageError{fmt.Sprintf("--for %s must not be negative", forDur)}
	}
	nc, c, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	js := c.JetStream()
	var names []string
	if *all {
		s, err := js.Stream(ctx, *stream)
		if err != nil {
			return fmt.Errorf("stream %s: %w", *stream, err)
		}
		lister := s.ConsumerNames(ctx)
		for name := range lister.Name() {
			if _, err := strconv.Atoi(strings.TrimPrefix(name, "telha-worker-")); err == nil && strings.HasPrefix(name, "telha-worker-") {
				names = append(names, name)
			}
		}
		if err := lister.Err(); err != nil {
			return fmt.Errorf("consumers of %s: %w", *stream, err)
		}
		if len(names) == 0 {
			return fmt.Errorf("stream %s has no worker consumer (telha-worker-*): a worker creates its own when it starts", *stream)
		}
	} else {
		names = []string{client.ConsumerName(*replica)}
	}
	var until time.Time
	if forDur > 0 {
		until = time.Now().Add(forDur)
	}
	enc := json.NewEncoder(stdout)
	for _, name := range names {
		var st client.PauseState
		if cmd == "pause" {
			st, err = client.PauseConsumer(ctx, js, *stream, name, until)
		} else {
			st, err = client.ResumeConsumer(ctx, js, *stream, name)
		}
		if err != nil {
			return err
		}
		out := map[string]any{"consumer": name, "paused": st.Paused, "until": nil, "state": st.String()}
		if st.Paused {
			out["until"] = st.Until.Format(time.RFC3339)
		}
		if err := enc.Encode(out); err != nil {
			return err
		}
	}
	return nil
}
