package slot

import (
	"errors"
	"reflect"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/metrics"
	"github.com/telha/telha-cascade/reaper"
)

// TestOptionsHooksAreAllCalled (issue 23 item 22): Options says the
// CascadeHooks and ReaperHooks a caller passes are called after the
// worker's own; the wiring used to drop every hook it did not itself
// observe (EraseScrubbed, EraseChecked, JournalScanned, Stalled,
// EraseFinished). Every func field of both structs, present and future, is
// set to a recorder; each hook the worker installs must reach it.
func TestOptionsHooksAreAllCalled(t *testing.T) {
	a := &Slot{metrics: metrics.New(metrics.Build{}, metrics.Labels{})}
	checkHooksReachNext(t, "cascade.Hooks", func(next cascade.Hooks) cascade.Hooks { return a.wiredCascadeHooks(next) })
	checkHooksReachNext(t, "reaper.Hooks", func(next reaper.Hooks) reaper.Hooks { return a.wiredReaperHooks(next) })
}

func checkHooksReachNext[H any](t *testing.T, name string, wire func(H) H) {
	t.Helper()
	var next H
	nv := reflect.ValueOf(&next).Elem()
	calls := map[string]int{}
	for i := 0; i < nv.NumField(); i++ {
		f := nv.Type().Field(i)
		if f.Type.Kind() != reflect.Func {
			t.Fatalf("%s.%s is not a func: the check needs extending", name, f.Name)
		}
		fname := f.Name
		nv.Field(i).Set(reflect.MakeFunc(f.Type, func([]reflect.Value) []reflect.Value {
			calls[fname]++
			var out []reflect.Value
			for j := 0; j < f.Type.NumOut(); j++ {
				out = append(out, reflect.Zero(f.Type.Out(j)))
			}
			return out
		}))
	}
	got := reflect.ValueOf(wire(next))
	for i := 0; i < got.NumField(); i++ {
		f := got.Type().Field(i)
		h := got.Field(i)
		if h.IsNil() {
			t.Errorf("%s.%s: the worker installs no hook, so the caller's is never called", name, f.Name)
			continue
		}
		var args []reflect.Value
		for j := 0; j < f.Type.NumIn(); j++ {
			in := f.Type.In(j)
			if in.Kind() == reflect.Pointer {
				args = append(args, reflect.New(in.Elem()))
			} else {
				args = append(args, reflect.Zero(in))
			}
		}
		h.Call(args)
		if calls[f.Name] != 1 {
			t.Errorf("%s.%s: the caller's hook was called %d times, want 1", name, f.Name, calls[f.Name])
		}
	}
}

// TestMetricsReaperHooksChain: the wiring counts a parked result and still
// calls the hook the caller passed.
func TestMetricsReaperHooksChain(t *testing.T) {
	a := &Slot{metrics: metrics.New(metrics.Build{}, metrics.Labels{})}
	called := 0
	h := a.reaperHooks(reaper.Hooks{OutboxParked: func(string, string, error) { called++ }})
	h.OutboxParked("t", "r", errors.New("refused"))
	if got := testutil.ToFloat64(a.metrics.ResultsParked); got != 1 || called != 1 {
		t.Fatalf("telha_results_parked_events_total = %v, next hook called %d times; want 1 and 1", got, called)
	}
}
