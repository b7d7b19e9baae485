package queue

import (
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Config is the queue side of the worker. Zero fields take the documented
// defaults (see Defaults).
type Config struct {
	// Prefix of every subject: <prefix>.req.<tenant>, <prefix>.res.<tenant>,
	// <prefix>.dlq.<tenant>. Default "telha".
	Prefix string
	// Stream names. Defaults TELHA_REQ, TELHA_RES, TELHA_DLQ.
	ReqStream, ResStream, DLQStream string
	// NoDedupStream is the empty, sealed stream the request stream sources
	// so that it may keep no duplicate window (see Provision). Default
	// <ReqStream>_NODEDUP.
	NoDedupStream string
	// StreamsProvisioned: the caller created the streams already
	// (ProvisionStreams, once for a member's many slots): Provision
	// creates only the consumer, and the streams only if one is missing.
	// Every stream update is a round of the cluster's meta group: 16
	// slots updating 4 unchanged streams each delayed a first start.
	StreamsProvisioned bool
	// Partitions is P, the partition count of the request stream, fixed at
	// install. Default 1.
	Partitions int
	// Owner is this replica's share of the partitions. Default 0/1 (all).
	Owner Owner
	// DuplicateWindow of the result and dead-letter streams (Nats-Msg-Id
	// dedup of the worker's own publishes). Default 2m. The request stream
	// has none: its ids are chosen by publishers, and a window shared by
	// every tenant let one tenant's publisher suppress another's requests.
	DuplicateWindow time.Duration
	// ResultsMaxAge bounds how long results are kept. Default 24h.
	ResultsMaxAge time.Duration
	// DLQMaxAge bounds how long dead letters are kept. Default 14 days.
	DLQMaxAge time.Duration
	// ResultsMaxBytes and DLQMaxBytes bound the size of the results and
	// dead-letter streams; the oldest messages go first. Default 1 GiB
	// each.
	ResultsMaxBytes, DLQMaxBytes int64
	// ResultsMaxPerTenant and DLQMaxPerTenant bound the messages kept per
	// tenant subject (<prefix>.res.<tenant>, <prefix>.dlq.<tenant>); a
	// tenant over its bound loses its own oldest first, not another
	// tenant's. Defaults 1,000,000 and 10,000; -1: no per-tenant bound.
	ResultsMaxPerTenant, DLQMaxPerTenant int64
	// StreamReplicas for streams this worker creates. Default 1.
	StreamReplicas int
	// MaxDeliver: a request that fails transiently on its MaxDeliver-th
	// delivery (or later) is dead-lettered. Default 5. The consumer itself
	// redelivers without limit, so a crash never strands a message.
	MaxDeliver int
	// MaxDeaths: a request whose handling the worker did not survive this
	// many times is dead-lettered (crash_loop, result failed) instead of
	// being redelivered for ever. Counted from the second delivery on (a
	// marker is stored before a redelivered message is handled and deleted
	// when its delivery ends); a message that already killed the worker is
	// handled alone, so the requests that shared its group are not blamed.
	// Default 3.
	MaxDeaths int
	// AckWait of the consumer. Messages being worked on are kept alive with
	// InProgress well before it. Default 30s.
	AckWait time.Duration
	// MaxAckPending of the consumer. Default 4096.
	MaxAckPending int
	// StallCheck is how often an idle worker asks the server whether its
	// consumer holds requests it is not delivering (a pull subscription
	// that went silent, nats.go#2063); two such answers in a row restart
	// the pull. Default 5s; negative: never.
	StallCheck time.Duration
	// Buffer is how many messages wait between the consumer and the
	// groups being formed. Default 1024.
	Buffer int
	// BufferBytes bounds the request bytes the worker holds at once: what
	// the client pulls ahead (PullMaxBytes) and, separately, what waits
	// for or is in a group until that group is finished. A flood of large
	// messages therefore costs the worker at most about twice this, not
	// Buffer times the largest message (a 1,000-message flood of 200 KB
	// bodies held 815 MB before, docs/RELIABILITY.md). One message larger
	// than the budget is still taken when nothing else is held. Default
	// 16 MiB.
	BufferBytes int
	// GroupMax bounds a group (one durable batch). Default 512.
	GroupMax int
	// GroupWait is how long a group waits for more messages after its
	// first. Default 0: a group is whatever arrived while the previous one
	// was committing, so light load pays no added latency.
	GroupWait time.Duration
	// RetryBase and RetryMax shape the NakWithDelay backoff of transient
	// failures: base * 2^(delivery-1), capped. Defaults 500ms and 30s.
	RetryBase, RetryMax time.Duration
	// SecureDeleteAcked: overwrite each handled request message in the
	// request stream's files (JetStream's secure delete) just before acking
	// it. A work-queue ack only unlinks the message, and its bytes (a put's
	// props among them) stay in the stream's block file until the server
	// drops or compacts the block (CONTRACT §3, "Erasure"). Off by default:
	// the server overwrites and syncs per message, about 3 ms each, which
	// caps a worker at about 300 requests/s (docs/BENCHMARKS.md).
	SecureDeleteAcked bool
	// ChangeFeedOff: publish no change feed (the feed's cursor stays where
	// it is; turning the feed on again resumes it there, without a gap).
	// By default every slot publishes its tenants' changes to ChgStream
	// (feed.go, CONTRACT §5 "Change feed").
	ChangeFeedOff bool
	// ChangeFeedNoProps: a put's change carries no props.
	ChangeFeedNoProps bool
	// ChgStream is the change feed's stream. Default TELHA_CHG.
	ChgStream string
	// ChangesMaxAge and ChangesMaxBytes bound what the feed keeps (oldest
	// first). Defaults 7 days and 1 GiB.
	ChangesMaxAge   time.Duration
	ChangesMaxBytes int64
	// ChangesMaxPerTenant bounds the changes the feed keeps per tenant
	// subject (telha.chg.<tenant>.<kind>.<op>), the tenant's oldest going
	// first: one tenant's flood ages out its own history, not the other
	// tenants'. Default 1,000,000; -1: no per-tenant limit.
	ChangesMaxPerTenant int64
	// ChangesMaxRate bounds the changes a slot's feed publishes per
	// second (a burst, such as a finished million-edge cascade, waits
	// instead of taking the CPU from requests). Default 20,000; -1:
	// unbounded.
	ChangesMaxRate int
	// ChangesDuplicateWindow: the feed's Nats-Msg-Id window, how long a
	// change published again (a slot that moved, a crash between a publish
	// and its cursor's save) is recognised and stored once. Default 10m.
	ChangesDuplicateWindow time.Duration
	// TracerProvider receives the requests' spans (nil: tracing off, no
	// cost). See trace.go.
	TracerProvider trace.TracerProvider
}

// Defaults returns c with every zero field set to its default.
func (c Config) Defaults() Config {
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	def(&c.Prefix, "telha")
	def(&c.ReqStream, "TELHA_REQ")
	def(&c.ResStream, "TELHA_RES")
	def(&c.DLQStream, "TELHA_DLQ")
	def(&c.NoDedupStream, c.ReqStream+"_NODEDUP")
	def(&c.ChgStream, "TELHA_CHG")
	defD := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	defD(&c.DuplicateWindow, 2*time.Minute)
	defD(&c.ResultsMaxAge, 24*time.Hour)
	defD(&c.DLQMaxAge, 14*24*time.Hour)
	defD(&c.ChangesMaxAge, 7*24*time.Hour)
	defD(&c.ChangesDuplicateWindow, 10*time.Minute)
	defI64 := func(p *int64, v int64) {
		if *p == 0 {
			*p = v
		}
	}
	defI64(&c.ResultsMaxBytes, 1<<30)
	defI64(&c.DLQMaxBytes, 1<<30)
	defI64(&c.ChangesMaxBytes, 1<<30)
	defI64(&c.ChangesMaxPerTenant, 1_000_000)
	defI64(&c.ResultsMaxPerTenant, 1_000_000)
	defI64(&c.DLQMaxPerTenant, 10_000)
	if c.MaxDeaths <= 0 {
		c.MaxDeaths = 3
	}
	defD(&c.AckWait, 30*time.Second)
	defD(&c.StallCheck, 5*time.Second)
	defD(&c.RetryBase, 500*time.Millisecond)
	defD(&c.RetryMax, 30*time.Second)
	defI := func(p *int, v int) {
		if *p <= 0 {
			*p = v
		}
	}
	defI(&c.Partitions, 1)
	defI(&c.StreamReplicas, 1)
	defI(&c.MaxDeliver, 5)
	defI(&c.MaxAckPending, 4096)
	defI(&c.Buffer, 1024)
	defI(&c.BufferBytes, 16<<20)
	defI(&c.GroupMax, 512)
	if c.ChangesMaxRate == 0 {
		c.ChangesMaxRate = 20_000
	}
	if c.Owner.Count == 0 {
		c.Owner = Owner{Index: 0, Count: 1}
	}
	return c
}

// ConsumerName is the durable consumer of replica i.
func (c Config) ConsumerName() string { return fmt.Sprintf("telha-worker-%d", c.Owner.Index) }

func (c Config) resSubject(tenant string) string { return c.Prefix + ".res." + tenant }
func (c Config) dlqSubject(tenant string) string { return c.Prefix + ".dlq." + tenant }

func (c Config) backoff(delivery uint64) time.Duration {
	d := c.RetryBase
	for i := uint64(1); i < delivery && d < c.RetryMax; i++ {
		d *= 2
	}
	return min(d, c.RetryMax)
}
