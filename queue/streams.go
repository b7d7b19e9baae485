package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Provision creates or updates the three streams and this replica's durable
// consumer. It is idempotent: a restarted worker finds them as they are.
//
// TELHA_REQ takes <prefix>.req.<tenant> and stores it as
// <prefix>.req.<p>.<tenant> with the server's {{partition(P,1)}} transform
// (FNV-1a of the tenant token mod P). Replica i of N consumes the partitions
// p with p % N == i through its own durable consumer; their filters never
// overlap, as a work-queue stream requires.
//
// TELHA_REQ keeps no duplicate window. Its Nats-Msg-Ids are chosen by
// publishers, and a window is shared by every subject of the stream: a
// publisher of tenant a could make tenant b's request a silent duplicate
// (issue 20). The server turns a zero window into 2 minutes and refuses one
// under 100ms, except for a stream that sources another: so TELHA_REQ
// sources TELHA_REQ_NODEDUP (Config.NoDedupStream), a stream created empty
// and sealed at once, which can never hold a message. Exactly-once effect
// rests on the worker's receipts, which are per tenant. An installed
// TELHA_REQ (with the old 2-minute window) is updated in place.
//
// Replica 0's consumer also takes <prefix>.req.* (three tokens): only a
// message published to the literal subject telha.req.* or telha.req.> is
// stored so (the partition transform cannot map a wildcard token), and it
// is dead-lettered instead of staying in the stream, unanswered, for ever.
func Provision(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.Consumer, error) {
	c = c.Defaults()
	var filters []string
	for _, p := range c.Owner.Partitions(c.Partitions) {
		filters = append(filters, fmt.Sprintf("%s.req.%d.*", c.Prefix, p))
	}
	if len(filters) == 0 {
		return nil, fmt.Errorf("replica %s owns none of %d partitions", c.Owner, c.Partitions)
	}
	if c.Owner.Index == 0 {
		filters = append(filters, c.Prefix+".req.*")
	}
	if !c.StreamsProvisioned {
		if err := ProvisionStreams(ctx, js, c); err != nil {
			return nil, err
		}
	}
	cc := jetstream.ConsumerConfig{
		Durable:        c.ConsumerName(),
		Description:    fmt.Sprintf("telha-cascade replica %s of %d partitions", c.Owner, c.Partitions),
		FilterSubjects: filters,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        c.AckWait,
		// Unlimited at the server: a message whose worker was killed is
		// always redelivered (a server-side limit would strand it, unacked
		// and undelivered, for ever). The worker itself dead-letters a
		// request that fails transiently on its MaxDeliver-th delivery.
		MaxDeliver:    -1,
		MaxAckPending: c.MaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, c.ReqStream, cc)
	if c.StreamsProvisioned && errors.Is(err, jetstream.ErrStreamNotFound) {
		// Deleted since the caller created it: create them again.
		if err := ProvisionStreams(ctx, js, c); err != nil {
			return nil, err
		}
		cons, err = js.CreateOrUpdateConsumer(ctx, c.ReqStream, cc)
	}
	if consumerNotUnique(err) {
		// A replica count change leaves consumers of replicas that no longer
		// exist holding partitions; remove those (index >= N) and retry.
		// Consumers of live replicas converge as they restart.
		if derr := dropStaleConsumers(ctx, js, c); derr != nil {
			return nil, errors.Join(err, derr)
		}
		cons, err = js.CreateOrUpdateConsumer(ctx, c.ReqStream, cc)
	}
	if err != nil {
		return nil, fmt.Errorf("provision consumer %s: %w", c.ConsumerName(), err)
	}
	return cons, nil
}

// ProvisionStreams creates or updates the streams of Provision, without
// a consumer: what every replica shares. A caller that starts many
// replicas at once (a member with many slots) calls it once before them,
// so that they update streams that exist rather than create the same
// streams at once, which a JetStream cluster answers late or never
// (nats-server#3677).
func ProvisionStreams(ctx context.Context, js jetstream.JetStream, c Config) error {
	c = c.Defaults()
	req := jetstream.StreamConfig{
		Name:        c.ReqStream,
		Description: "telha-cascade delete and write requests",
		Subjects:    []string{c.Prefix + ".req.*"},
		SubjectTransform: &jetstream.SubjectTransformConfig{
			Source:      c.Prefix + ".req.*",
			Destination: fmt.Sprintf("%s.req.{{partition(%d,1)}}.{{wildcard(1)}}", c.Prefix, c.Partitions),
		},
		Retention:  jetstream.WorkQueuePolicy,
		Storage:    jetstream.FileStorage,
		Duplicates: 0, // none: allowed because of the source below
		Sources:    []*jetstream.StreamSource{{Name: c.NoDedupStream}},
		MaxMsgSize: 1 << 20,
		Replicas:   c.StreamReplicas,
	}
	res := jetstream.StreamConfig{
		Name:        c.ResStream,
		Description: "telha-cascade results, one per request",
		Subjects:    []string{c.Prefix + ".res.*"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		MaxAge:      c.ResultsMaxAge,
		MaxBytes:    c.ResultsMaxBytes,
		// A tenant over its share loses its own oldest results, not
		// another tenant's (until the stream as a whole is full).
		MaxMsgsPerSubject: c.ResultsMaxPerTenant,
		Discard:           jetstream.DiscardOld,
		Duplicates:        c.DuplicateWindow,
		Replicas:          c.StreamReplicas,
	}
	dlq := jetstream.StreamConfig{
		Name:              c.DLQStream,
		Description:       "telha-cascade dead letters: payloads that can never apply",
		Subjects:          []string{c.Prefix + ".dlq.*"},
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		MaxAge:            c.DLQMaxAge,
		MaxBytes:          c.DLQMaxBytes,
		MaxMsgsPerSubject: c.DLQMaxPerTenant,
		Discard:           jetstream.DiscardOld,
		Duplicates:        c.DuplicateWindow,
		Replicas:          c.StreamReplicas,
	}
	streams := []jetstream.StreamConfig{req, res, dlq}
	if !c.ChangeFeedOff {
		streams = append(streams, ChangesStreamConfig(c))
	}
	// P is fixed at install: changing it moves tenants between partitions
	// (and replicas) that do not hold their data. Refuse rather than
	// silently re-partition an installed stream.
	if existing, err := js.Stream(ctx, c.ReqStream); err == nil {
		info := existing.CachedInfo()
		if st := info.Config.SubjectTransform; st != nil && st.Destination != req.SubjectTransform.Destination {
			return fmt.Errorf("%w: stream %s maps %s to %s; this worker is configured for %s (--partitions %d). "+
				"P is fixed at install: changing it needs a data move (see docs/DEPLOY.md)",
				ErrPartitionsChanged, c.ReqStream, st.Source, st.Destination, req.SubjectTransform.Destination, c.Partitions)
		}
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("look up stream %s: %w", c.ReqStream, err)
	}
	if err := provisionNoDedup(ctx, js, c); err != nil {
		return err
	}
	for _, sc := range streams {
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("provision stream %s: %w", sc.Name, err)
		}
	}
	return nil
}

// provisionNoDedup makes sure the stream TELHA_REQ sources exists, empty
// and sealed (a sealed stream stores nothing and cannot be unsealed). A
// stream cannot be created sealed: it is created, purged of anything
// published in between, then sealed.
func provisionNoDedup(ctx context.Context, js jetstream.JetStream, c Config) error {
	cfg := jetstream.StreamConfig{
		Name: c.NoDedupStream,
		Description: fmt.Sprintf("telha-cascade: empty and sealed; %s sources it so that it may keep no duplicate window "+
			"(a window shared by every tenant let one tenant suppress another's requests)", c.ReqStream),
		Subjects:  []string{c.NoDedupStream},
		Retention: jetstream.LimitsPolicy,
		Storage:   jetstream.FileStorage,
		MaxMsgs:   1,
		Discard:   jetstream.DiscardNew,
		Replicas:  c.StreamReplicas,
	}
	s, err := js.Stream(ctx, c.NoDedupStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, cfg)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			s, err = js.Stream(ctx, c.NoDedupStream) // another replica created it
		}
	}
	if err != nil {
		return fmt.Errorf("provision stream %s: %w", c.NoDedupStream, err)
	}
	info := s.CachedInfo()
	if info.Config.Sealed {
		return nil
	}
	if err := s.Purge(ctx); err != nil {
		return sealedMeanwhile(ctx, s, fmt.Errorf("provision stream %s: purge before sealing: %w", c.NoDedupStream, err))
	}
	sealed := info.Config
	sealed.Sealed = true
	if _, err := js.UpdateStream(ctx, sealed); err != nil {
		return sealedMeanwhile(ctx, s, fmt.Errorf("provision stream %s: seal: %w", c.NoDedupStream, err))
	}
	return nil
}

// sealedMeanwhile is nil if the stream is sealed now, else err. Replicas
// (or processes) provisioning at once on a fresh install race: one seals
// the stream while another, whose cached info shows it unsealed, purges or
// seals it, which the server refuses (a sealed stream denies purges, and
// an update may not clear its deny flags). That replica's work is done.
func sealedMeanwhile(ctx context.Context, s jetstream.Stream, err error) error {
	info, ierr := s.Info(ctx)
	if ierr != nil {
		return errors.Join(err, fmt.Errorf("re-read stream info: %w", ierr))
	}
	if info.Config.Sealed {
		return nil
	}
	return err
}

// jsErrCodeConsumerWQNotUnique is the server's JSConsumerWQConsumerNotUniqueErr
// ("filtered consumer not unique on workqueue stream"), which package
// jetstream has no constant for.
const jsErrCodeConsumerWQNotUnique jetstream.ErrorCode = 10100

// consumerNotUnique reports whether err is the server refusing a consumer
// whose filters overlap another consumer's on a work-queue stream.
func consumerNotUnique(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrCodeConsumerWQNotUnique
}

// ErrPartitionsChanged: the installed request stream has another partition
// count than the worker's --partitions.
var ErrPartitionsChanged = errors.New("partition count differs from the installed stream")

func dropStaleConsumers(ctx context.Context, js jetstream.JetStream, c Config) error {
	s, err := js.Stream(ctx, c.ReqStream)
	if err != nil {
		return err
	}
	names := s.ConsumerNames(ctx)
	for name := range names.Name() {
		var i int
		if _, err := fmt.Sscanf(name, "telha-worker-%d", &i); err == nil && i >= c.Owner.Count {
			if err := s.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return err
			}
		}
	}
	return names.Err()
}
