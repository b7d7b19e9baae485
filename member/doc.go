// Package member decides which worker process owns which partition slot,
// on JetStream and nothing else (issue 21, item 3: "ownership that moves").
//
// It owns:
//
//   - the membership: each worker process (a member, --member-id) keeps a
//     record in the KV bucket TELHA_MEMBERS, whose TTL expires it when the
//     process stops renewing (killed, frozen, cut off);
//   - the assignment: one KV entry per slot in TELHA_OWNERS_<N>, naming its
//     owner, an epoch that grows with each change of owner, and its warm
//     standbys; entries are written with revision compare-and-set only;
//   - the plan (Plan): a pure function from the live members and the
//     current assignment to the next one, balanced, sticky, and warm-first
//     (a live owner gives a slot up only to a standby that has caught up).
//
// It must not: open a store, consume a request, or decide that a write is
// safe. The KV only suggests who should write; what fences a zombie is the
// changelog's expected-last-sequence append (package partition). Every
// member computes the same plan; only the lowest live member id writes it,
// and the compare-and-set turns two writers into one.
//
// Each request to the buckets is bounded per try and sent again when
// unanswered (package attempt): a round must not wait out its deadline on
// one request routed to a paused server's replica.
package member
