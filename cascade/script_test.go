package cascade

import (
	"crypto/sha1"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of cascade/testdata scripts")

// TestScripts runs the scripts in testdata/: semantic tests an auditor can
// read, in the style of Pebble's data-driven tests. Each case is a command
// line, a "----" line, and the expected output, separated by blank lines.
// Entities are named (n1, e1, ...), valid times are years ("2025",
// "open"), and transaction times are shown as t<k>: k microseconds after
// the frozen clock's start, so scripts are deterministic.
//
// Commands:
//
//	max-batch-ops N                      (re)open the store with that threshold
//	put-node N [valid=FROM..TO]
//	put-edge E SRC->DST [label=L] [valid=FROM..TO]
//	tombstone-edge E [valid-end=Y]
//	tombstone-node N [valid-end=Y] [crash-after=K]   K: durable calls that land
//	restart                              a process restart on the same directory
//	resume                               ResumeJournals
//	read X [v=Y] [t=tK|now]              the version of X that reads live, or absent
//	                                     (v and t default to the far future: "now, going forward")
//	edges N [dir=out|in|both] [v=Y] [t=tK|now]
//	history X
//	journals                             each journal: edges landed, edges pending, node landed
//
// Run with -rewrite to regenerate expected outputs after a deliberate change.
func TestScripts(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.txt")
	if len(files) == 0 {
		t.Fatal("no scripts")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { runScript(t, f) })
	}
}

type script struct {
	t     *testing.T
	e     *env
	names map[string]uuid.UUID
	kinds map[string]storage.Kind
	byID  map[uuid.UUID]string
	max   int
}

func runScript(t *testing.T, path string) {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := &script{t: t, names: map[string]uuid.UUID{}, kinds: map[string]storage.Kind{}, byID: map[uuid.UUID]string{}}
	s.e = openEnv(t, "", Options{})
	var out strings.Builder
	blocks := strings.Split(strings.TrimSpace(string(raw)), "\n\n")
	for _, blk := range blocks {
		lines := strings.Split(blk, "\n")
		var comments []string
		for len(lines) > 0 && strings.HasPrefix(lines[0], "#") {
			comments = append(comments, lines[0])
			lines = lines[1:]
		}
		if len(lines) == 0 {
			out.WriteString(strings.Join(comments, "\n") + "\n\n")
			continue
		}
		cmd := lines[0]
		var want string
		if len(lines) > 1 && lines[1] == "----" {
			want = strings.Join(lines[2:], "\n")
		} else {
			t.Fatalf("%s: command %q has no ---- line", path, cmd)
		}
		got := strings.TrimRight(s.run(cmd), "\n")
		if got != want && !*rewrite {
			t.Errorf("%s: %s\n got:\n%s\nwant:\n%s", path, cmd, got, want)
		}
		for _, c := range comments {
			out.WriteString(c + "\n")
		}
		out.WriteString(cmd + "\n----\n" + got + "\n\n")
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(strings.TrimRight(out.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func (s *script) id(name string, k storage.Kind) uuid.UUID {
	if id, ok := s.names[name]; ok {
		return id
	}
	id := uuid.NewHash(sha1.New(), uuid.NameSpaceURL, []byte(name), 5)
	s.names[name], s.kinds[name], s.byID[id] = id, k, name
	return id
}

func (s *script) tx(ts storage.Ts) string {
	return fmt.Sprintf("t%d", int64(ts-storage.TsFromTime(t0)))
}

func (s *script) when(v string) storage.Ts {
	switch v {
	case "open":
		return storage.OpenEnd
	case "now":
		return storage.OpenEnd - 1
	}
	if k, ok := strings.CutPrefix(v, "t"); ok {
		n, err := strconv.ParseInt(k, 10, 64)
		if err != nil {
			s.t.Fatalf("bad time %q", v)
		}
		return storage.TsFromTime(t0) + storage.Ts(n)
	}
	y, err := strconv.Atoi(v)
	if err != nil {
		s.t.Fatalf("bad time %q", v)
	}
	return year(y)
}

func (s *script) show(ts storage.Ts) string {
	if ts == storage.OpenEnd {
		return "open"
	}
	if ts >= storage.TsFromTime(t0) && ts < storage.TsFromTime(t0)+1_000_000 {
		return s.tx(ts)
	}
	tm := ts.Time()
	if tm.Month() == 1 && tm.Day() == 1 && tm.Hour() == 0 && tm.Minute() == 0 && tm.Second() == 0 && tm.Nanosecond() == 0 {
		return strconv.Itoa(tm.Year())
	}
	return ts.String()
}

func outcome(err error) string {
	for _, k := range []error{ErrNotFound, ErrAlreadyTombstoned, ErrEndpointDead, ErrCascadeInFlight, ErrInvalid} {
		if errors.Is(err, k) {
			return strings.ReplaceAll(k.Error(), " ", "_")
		}
	}
	return "error: " + err.Error()
}

func (s *script) run(line string) string {
	f := strings.Fields(line)
	args := map[string]string{}
	var pos []string
	for _, a := range f[1:] {
		if k, v, ok := strings.Cut(a, "="); ok {
			args[k] = v
		} else {
			pos = append(pos, a)
		}
	}
	valid := func() (storage.Ts, storage.Ts) {
		v, ok := args["valid"]
		if !ok {
			return storage.NoTs, storage.NoTs
		}
		a, b, _ := strings.Cut(v, "..")
		return s.when(a), s.when(b)
	}
	sc := storage.MustScope("script")
	e := s.e
	switch f[0] {
	case "max-batch-ops":
		n, _ := strconv.Atoi(pos[0])
		e.opts.MaxBatchOps = n
		e.restart()
		return "ok"
	case "put-node":
		from, to := valid()
		tx, err := e.ops.PutNode(ctx, sc, storage.NodeWrite{ID: s.id(pos[0], storage.KindNode), ValidFrom: from, ValidTo: to, Prov: anon})
		if err != nil {
			return outcome(err)
		}
		return "ok " + s.tx(tx)
	case "put-edge":
		src, dst, _ := strings.Cut(pos[1], "->")
		from, to := valid()
		tx, err := e.ops.PutEdge(ctx, sc, storage.EdgeWrite{ID: s.id(pos[0], storage.KindEdge), Src: s.id(src, storage.KindNode), Dst: s.id(dst, storage.KindNode), Label: args["label"], ValidFrom: from, ValidTo: to, Prov: anon})
		if err != nil {
			return outcome(err)
		}
		return "ok " + s.tx(tx)
	case "tombstone-edge":
		end := storage.NoTs
		if v, ok := args["valid-end"]; ok {
			end = s.when(v)
		}
		rc, err := e.ops.TombstoneEdge(ctx, sc, s.id(pos[0], storage.KindEdge), end, anon)
		if err != nil {
			return outcome(err)
		}
		return "ok " + s.tx(rc.TxTime)
	case "tombstone-node":
		end := storage.NoTs
		if v, ok := args["valid-end"]; ok {
			end = s.when(v)
		}
		if k, ok := args["crash-after"]; ok {
			n, _ := strconv.Atoi(k)
			e.fault.CrashAfter(e.fault.Calls() + n)
		}
		before := e.fault.Calls()
		rc, err := e.ops.TombstoneNode(ctx, sc, s.id(pos[0], storage.KindNode), end, anon)
		e.fault.SetInject(nil)
		if errors.Is(err, storage.ErrInjected) {
			return fmt.Sprintf("crashed after %d durable calls", e.fault.Calls()-before-1)
		}
		if err != nil {
			return outcome(err)
		}
		return fmt.Sprintf("ok %s edges=%d journaled=%v durable-calls=%d", s.tx(rc.TxTime), rc.EdgesTombstoned, rc.Journaled, e.fault.Calls()-before)
	case "restart":
		e.restart()
		return "ok"
	case "resume":
		n, err := e.ops.ResumeJournals(ctx, sc)
		if err != nil {
			return outcome(err)
		}
		return fmt.Sprintf("resumed %d", n)
	case "read":
		v, t := s.coord(args)
		k := s.kinds[pos[0]]
		ver, ok, err := storage.AsOf(e.store.Reader(), sc, k, s.id(pos[0], k), v, t)
		if err != nil {
			return outcome(err)
		}
		if !ok {
			return "absent"
		}
		return s.version(&ver)
	case "edges":
		v, t := s.coord(args)
		dir := storage.DirBoth
		if d, ok := args["dir"]; ok {
			dir, _ = storage.ParseDirection(d)
		}
		es, err := storage.EdgesOf(e.store.Reader(), sc, s.id(pos[0], storage.KindNode), dir, v, t)
		if err != nil {
			return outcome(err)
		}
		var names []string
		for _, x := range es {
			names = append(names, s.byID[x.ID])
		}
		sort.Strings(names)
		if len(names) == 0 {
			return "(none)"
		}
		return strings.Join(names, " ")
	case "history":
		k := s.kinds[pos[0]]
		h, err := storage.History(e.store.Reader(), sc, k, s.id(pos[0], k))
		if err != nil {
			return outcome(err)
		}
		var lines []string
		for i := range h {
			lines = append(lines, s.version(&h[i]))
		}
		return strings.Join(lines, "\n")
	case "journals":
		var lines []string
		for _, j := range e.store.Journals().List() {
			// What is left of it, re-derived from the frozen neighbourhood.
			sum, err := ScanJournal(e.store.Reader(), j, nil, nil)
			if err != nil {
				return outcome(err)
			}
			lines = append(lines, fmt.Sprintf("%s tx=%s landed=%d pending=%d node_landed=%v", s.byID[j.J.NodeID], s.tx(j.J.Tx), sum.Landed, sum.Pending, sum.NodeLanded))
		}
		if len(lines) == 0 {
			return "(none)"
		}
		return strings.Join(lines, "\n")
	}
	s.t.Fatalf("unknown command %q", line)
	return ""
}

func (s *script) coord(args map[string]string) (storage.Ts, storage.Ts) {
	v, t := storage.OpenEnd-1, storage.OpenEnd-1 // default: the far future, as of now
	if x, ok := args["v"]; ok {
		v = s.when(x)
	}
	if x, ok := args["t"]; ok {
		t = s.when(x)
	}
	return v, t
}

func (s *script) version(v *storage.Version) string {
	out := fmt.Sprintf("%s valid=[%s, %s)", s.tx(v.Tx.Start), s.show(v.Valid.Start), s.show(v.Valid.End))
	if v.Kind == storage.KindEdge {
		out += fmt.Sprintf(" %s->%s", s.byID[v.Src], s.byID[v.Dst])
	}
	if v.Tombstone {
		out += " tombstone"
	}
	return out
}
