// Package queue is the NATS JetStream side of the worker: it provisions the
// streams (TELHA_REQ with the partition subject transform, TELHA_RES,
// TELHA_DLQ) and this replica's durable pull consumer, decodes and validates
// request messages (the wire contract of CONTRACT §5), applies them in groups
// through cascade.Ops (group commit: one durable batch per group, receipts
// included), publishes one result per request (Publisher; package reaper
// publishes journaled cascades' results from the durable outbox through the
// same Publisher), dead-letters what can never apply, and publishes each
// slot's change feed to TELHA_CHG (feed.go: FeedPublisher reads what
// committed from the store, storage.ReadFeed, and saves its cursors through
// the writer once a round is stored; feedconn.go: the feeds' own NATS
// connection, one per process, which never reconnects).
//
// Delivery: at-least-once in, exactly-once effect. A message is acked only
// after its effect (and receipt) is durable and its result has been accepted
// by the results stream, or, for a journaled cascade, once the journal (the
// commit point) is durable; the result then comes from the outbox. A message
// is terminated only after its copy is safe in TELHA_DLQ and its result is
// stored (or, loudly, on its last delivery).
//
// No tenant's input reaches another tenant or the worker's own state
// unbounded: TELHA_REQ keeps no duplicate window (it sources the sealed
// TELHA_REQ_NODEDUP so the server allows that); results and dead letters
// go to the token the publisher used (AnswerToken); result ids name the
// answer (ResultMsgID); headers and echoes are cut (bounds.go); metric
// labels come from fixed sets.
//
// Liveness: a pull subscription that goes silent while the consumer holds
// requests (a NATS client bug after a consumer leader change) is restarted
// by the stall watch (stall.go), which looks only while the worker is idle.
//
// What it must not do: decide graph semantics (cascade and storage do),
// build storage keys, or serve HTTP.
package queue
