package main

import (
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// cpuSample is the machine's and this process's CPU time at one moment,
// from /proc/stat and /proc/self/stat (clock ticks, 100 per second).
type cpuSample struct {
	at          time.Time
	busy, total int64 // machine, all CPUs
	self        int64 // this process (utime+stime, all threads)
}

func sampleCPU() cpuSample {
	s := cpuSample{at: time.Now()}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		if len(f) > 4 && f[0] == "cpu" {
			for i, v := range f[1:] {
				n, _ := strconv.ParseInt(v, 10, 64)
				if i >= 8 { // guest, guest_nice: already in user, nice
					break
				}
				s.total += n
				if i != 3 && i != 4 { // idle, iowait
					s.busy += n
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/self/stat"); err == nil {
		// Fields after the command (which may contain spaces) start at ")".
		if i := strings.LastIndexByte(string(b), ')'); i > 0 {
			f := strings.Fields(string(b)[i+1:])
			if len(f) > 13 {
				u, _ := strconv.ParseInt(f[11], 10, 64)
				st, _ := strconv.ParseInt(f[12], 10, 64)
				s.self = u + st
			}
		}
	}
	return s
}

// cpuUse is the CPU used during a phase, in cores (2.0 = both CPUs of a
// 2-CPU machine busy all the time).
type cpuUse struct {
	Process float64 `json:"process_cores"` // this process (worker, NATS server, publishers)
	Others  float64 `json:"other_cores"`   // everything else on the machine
	Cores   int     `json:"machine_cores"`
}

func cpuSince(a cpuSample, cores int) cpuUse {
	b := sampleCPU()
	secs := b.at.Sub(a.at).Seconds()
	if secs <= 0 || b.total <= a.total {
		return cpuUse{Cores: cores}
	}
	// Machine busy share of all CPUs over the window, in cores.
	busy := float64(b.busy-a.busy) / float64(b.total-a.total) * float64(cores)
	self := float64(b.self-a.self) / 100 / secs
	return cpuUse{Process: round3(self), Others: round3(max(0, busy-self)), Cores: cores}
}

// waitIdle waits, up to limit, until the rest of the machine has used less
// than 0.2 cores for a whole second (other processes distort the figures).
// It returns the other processes' use in the last window.
func waitIdle(limit time.Duration, cores int, pg progress) float64 {
	if limit <= 0 {
		return 0
	}
	deadline := time.Now().Add(limit)
	warned := false
	for {
		a := sampleCPU()
		time.Sleep(time.Second)
		u := cpuSince(a, cores)
		if u.Others < 0.2 || time.Now().After(deadline) {
			if u.Others >= 0.2 {
				pg.printf("machine still busy (%.2f cores used by other processes); measuring anyway", u.Others)
			}
			return u.Others
		}
		if !warned {
			pg.printf("waiting for other processes to quiet down (%.2f cores busy) ...", u.Others)
			warned = true
		}
	}
}

// pebbleStats is what Pebble did during a run (from its metrics).
type pebbleStats struct {
	Flushes       int64   `json:"flushes"`
	Compactions   int64   `json:"compactions"`
	FlushedMB     float64 `json:"flushed_mb"`
	CompactedMB   float64 `json:"compacted_mb"` // written by compactions (write amplification)
	CacheHitRate  float64 `json:"block_cache_hit_rate"`
	WALWrittenMB  float64 `json:"wal_written_mb"`
	StoreMBBefore float64 `json:"store_mb_before"`
	WriteStalls   uint64  `json:"write_stalls"`
	StallMs       float64 `json:"write_stall_ms"`
}

// stallMark is a store's write-stall counters at one moment.
type stallMark struct {
	n uint64
	d time.Duration
}

type staller interface {
	WriteStalls() (uint64, time.Duration)
}

func markStalls(s staller) stallMark {
	n, d := s.WriteStalls()
	return stallMark{n, d}
}

// withStalls adds the write stalls since m to ps.
func (ps pebbleStats) withStalls(s staller, m stallMark) pebbleStats {
	n, d := s.WriteStalls()
	ps.WriteStalls, ps.StallMs = n-m.n, round3(float64(d-m.d)/1e6)
	return ps
}

func pebbleDelta(a, b *pebble.Metrics) pebbleStats {
	if a == nil || b == nil {
		return pebbleStats{}
	}
	ta, tb := a.Total(), b.Total()
	hits, misses := b.BlockCache.Hits-a.BlockCache.Hits, b.BlockCache.Misses-a.BlockCache.Misses
	s := pebbleStats{
		Flushes:       b.Flush.Count - a.Flush.Count,
		Compactions:   b.Compact.Count - a.Compact.Count,
		FlushedMB:     round3(float64(tb.TableBytesFlushed-ta.TableBytesFlushed) / mb),
		CompactedMB:   round3(float64(tb.TableBytesCompacted-ta.TableBytesCompacted) / mb),
		WALWrittenMB:  round3(float64(b.WAL.BytesWritten-a.WAL.BytesWritten) / mb),
		StoreMBBefore: round3(float64(a.DiskSpaceUsage()) / mb),
	}
	if hits+misses > 0 {
		s.CacheHitRate = round3(float64(hits) / float64(hits+misses))
	}
	return s
}
