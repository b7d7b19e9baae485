package partition

import (
	"slices"
	"testing"
	"time"
)

// BenchmarkAppendSmall appends small write-sets (a Pebble batch of three
// puts of ~64 bytes, about 250 bytes) one after another to an R1 changelog
// on an embedded server, as the one writer of a partition does: each
// append waits for its ack. Reports latency percentiles per append.
//
//	go test -run '^$' -bench BenchmarkAppendSmall -benchtime 5000x ./partition/
func BenchmarkAppendSmall(b *testing.B) {
	ctx := testCtx(b, 10*time.Minute)
	js := startJS(b)
	cl, err := Open(ctx, js, Config{Partition: 0})
	if err != nil {
		b.Fatal(err)
	}
	db := openDB(b, "")
	batch := db.NewBatch()
	for i := range 3 {
		if err := batch.Set([]byte{0x01, 'k', byte(i)}, make([]byte, 64), nil); err != nil {
			b.Fatal(err)
		}
	}
	ws := batch.Repr()
	b.SetBytes(int64(len(ws)))
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		if _, err := cl.Append(ctx, ws); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
	b.ReportMetric(float64(len(ws)), "ws-bytes")
}
