package queue

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/testnats"
)

// TestProvisionAfterReplicaCountShrinks: after a replica count change
// (3 to 2 replicas over 4 partitions), replica 0's new filters overlap
// those of telha-worker-2, a replica that no longer exists. The server
// refuses the update with its "filtered consumer not unique on workqueue
// stream" error, which Provision recognises by its JetStream error code
// (issue 23 item 22: it matched the text), drops the stale consumer and
// retries.
func TestProvisionAfterReplicaCountShrinks(t *testing.T) {
	ns := testnats.Start(t)
	nc := testnats.Connect(t, ns.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < 3; i++ {
		if _, err := Provision(ctx, js, Config{Partitions: 4, Owner: Owner{i, 3}}); err != nil {
			t.Fatalf("replica %d of 3: %v", i, err)
		}
	}
	// What the server answers when the stale consumer is still there.
	cc := jetstream.ConsumerConfig{Durable: "probe", FilterSubjects: []string{"telha.req.2.*"}, AckPolicy: jetstream.AckExplicitPolicy}
	_, perr := js.CreateOrUpdateConsumer(ctx, "TELHA_REQ", cc)
	if !consumerNotUnique(perr) {
		t.Fatalf("an overlapping work-queue consumer: %v; consumerNotUnique does not recognise it", perr)
	}
	if _, err := Provision(ctx, js, Config{Partitions: 4, Owner: Owner{0, 2}}); err != nil {
		t.Fatalf("replica 0 of 2 after 3 replicas: %v", err)
	}
	if _, err := js.Consumer(ctx, "TELHA_REQ", "telha-worker-2"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("the stale consumer telha-worker-2: %v, want it dropped", err)
	}
}

// TestConsumerNotUniqueByCode: the check is the JetStream error code, not
// the text (which the server may reword).
func TestConsumerNotUniqueByCode(t *testing.T) {
	coded := &jetstream.APIError{Code: 400, ErrorCode: jsErrCodeConsumerWQNotUnique, Description: "reworded"}
	if !consumerNotUnique(fmt.Errorf("provision: %w", coded)) {
		t.Error("a wrapped APIError with code 10100 is not recognised")
	}
	if consumerNotUnique(errors.New("filtered consumer not unique on workqueue stream")) {
		t.Error("a plain error with the text is taken for the server's code")
	}
	if consumerNotUnique(&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeOverlappingFilterSubjects, Description: "not unique"}) {
		t.Error("another code is taken for 10100")
	}
	if consumerNotUnique(nil) {
		t.Error("nil")
	}
}
