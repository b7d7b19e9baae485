package queue

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
)

// TestTracingOffCostsNothing: with no TracerProvider, starting and ending
// a request's span allocates nothing and never builds its attributes (the
// worker does this for every request).
func TestTracingOffCostsNothing(t *testing.T) {
	w := &Worker{}
	built := 0
	attrs := func() []attribute.KeyValue { built++; return []attribute.KeyValue{attribute.String("k", "v")} }
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		_, span := w.start(ctx, "telha.decode", attrs)
		span.End()
	})
	if allocs != 0 || built != 0 {
		t.Fatalf("tracing off: %.1f allocations a span, attributes built %d times; want none", allocs, built)
	}
}
