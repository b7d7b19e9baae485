package queue

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Tracing (CONTRACT §5, "Tracing"): a W3C traceparent header on a request
// message is the parent of the request's spans (decode, group commit, the
// journal and its chunks, result, dead letter) and is carried onto its
// result and dead-letter messages. Off unless a TracerProvider is given
// (the worker's --otlp-endpoint); off, every span is a no-op.

// TraceContext is the propagator: W3C trace context (traceparent,
// tracestate).
var TraceContext = propagation.TraceContext{}

// HeaderCarrier adapts NATS message headers to the propagator.
type HeaderCarrier nats.Header

func (c HeaderCarrier) Get(k string) string { return nats.Header(c).Get(k) }
func (c HeaderCarrier) Set(k, v string)     { nats.Header(c).Set(k, v) }
func (c HeaderCarrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}

// offSpan is what start returns when tracing is off: a span that records
// nothing.
var offSpan = trace.SpanFromContext(context.Background())

// start starts a span under ctx; attrs, when set, is called only for a
// span that records. With tracing off it does nothing at all (no context,
// no attribute, no allocation: requests pay nothing).
func (w *Worker) start(ctx context.Context, name string, attrs func() []attribute.KeyValue) (context.Context, trace.Span) {
	if w.cfg.TracerProvider == nil {
		return ctx, offSpan
	}
	ctx, span := w.cfg.TracerProvider.Tracer("github.com/telha/telha-cascade/queue").Start(ctx, name)
	if attrs != nil && span.IsRecording() {
		span.SetAttributes(attrs()...)
	}
	return ctx, span
}

// traceOf returns the trace context a request message carries (an empty
// context without a traceparent).
func traceOf(h nats.Header) context.Context {
	if h == nil {
		return context.Background()
	}
	return TraceContext.Extract(context.Background(), HeaderCarrier(h))
}

// Traceparent returns the W3C traceparent of ctx's span ("" when none).
func Traceparent(ctx context.Context) string {
	m := propagation.MapCarrier{}
	TraceContext.Inject(ctx, m)
	return m["traceparent"]
}

// ContextWithTraceparent returns a context whose remote parent is tp.
func ContextWithTraceparent(ctx context.Context, tp string) context.Context {
	if tp == "" {
		return ctx
	}
	return TraceContext.Extract(ctx, propagation.MapCarrier{"traceparent": tp})
}

func requestAttrs(it *item) []attribute.KeyValue {
	a := []attribute.KeyValue{attribute.String("messaging.destination", it.msg.Subject()), attribute.String("telha.tenant", it.tenant)}
	if it.rej == nil {
		a = append(a, attribute.String("telha.request_id", it.req.RequestID), attribute.String("telha.op", it.req.Op.String()),
			attribute.String("telha.id", it.req.ID.String()))
	} else {
		a = append(a, attribute.String("telha.request_id", it.rej.RequestID), attribute.String("telha.reject", it.rej.Reason))
	}
	return a
}
