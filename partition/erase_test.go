package partition

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// TestDeleteObjectFinishesAnInterruptedDelete: a delete cut short after it
// overwrote some chunks (a crash, a scrub past its bound) leaves an object
// not yet marked deleted with fewer chunks than its info says; the next
// DeleteObject overwrites the rest and deletes it (it failed for good
// before, expecting the object's chunk count).
func TestDeleteObjectFinishesAnInterruptedDelete(t *testing.T) {
	ctx, _, js, obs := startBucket(t)
	const name = "partition-0/seq-00000000000000000007.tar"
	body := bytes.Repeat([]byte("chunk-bytes-"), 4096) // 48 KB in 4 KB chunks
	info, err := obs.Put(ctx, jetstream.ObjectMeta{Name: name, Opts: &jetstream.ObjectMetaOptions{ChunkSize: 4096}}, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if info.Chunks < 3 {
		t.Fatalf("%d chunks; the test needs several", info.Chunks)
	}
	s, err := js.Stream(ctx, "OBJ_TELHA_CKPT")
	if err != nil {
		t.Fatal(err)
	}
	subject := fmt.Sprintf("$O.TELHA_CKPT.C.%s", info.NUID)
	// The interrupted delete: its first two chunks overwritten, no more.
	seqs, err := sequencesOf(ctx, s, subject, int(info.Chunks))
	if err != nil {
		t.Fatal(err)
	}
	for _, seq := range seqs[:2] {
		if err := s.SecureDeleteMsg(ctx, seq); err != nil {
			t.Fatal(err)
		}
	}
	if err := DeleteObject(ctx, js, obs, "TELHA_CKPT", name); err != nil {
		t.Fatalf("the delete after an interrupted one: %v", err)
	}
	si, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	if n := si.State.Subjects[subject]; n != 0 {
		t.Fatalf("%d chunks left after the delete", n)
	}
	if _, err := obs.GetInfo(ctx, name); err == nil {
		t.Fatal("the object is still there")
	}
}
