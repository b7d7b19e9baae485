// Package ui is the status page the worker serves at /ui/ on the read API's
// address: server-rendered HTML (html/template, assets embedded; no CDN,
// no inline script: one static file asks confirm() before write actions)
// for the SRE at 3 a.m. and the auditor. Pages: overview (refreshes itself;
// rates over the last minute from the worker's own samples, queue figures
// with their as-of, the consumer's pause with pause and resume), journals
// (progress, rate and ETA from the progress observed between samples,
// the attempt in progress; it refreshes itself while one runs; the
// recently finished ones), dead letters (filter, body,
// headers, retry and discard, one by one or the page shown), requests (the
// lookup, pointing an invalid request to its dead letter; the recent
// results by status), and the as-of explorer (a node or edge at a (valid,
// tx) coordinate, how it was deleted, its edges there a page at a time
// with their bounded count, and an SVG of its history with time ticks).
//
// It owns rendering and the page's own access rules (server-side sessions
// behind a random cookie, never a token in a cookie; a CSRF token per
// session, replaced after each POST; Origin checked on every POST;
// tenant scoping of every list and total; operate role for write
// actions), on top of package api's Auth. Every view costs O(its page):
// dead letters, edges and history are paged, bodies shown bounded.
//
// What it must not do: write to the store (its only writes are dead-letter
// retries and discards, through the DeadLetters it is given, and the
// consumer's pause, through the Pauser: operate role on every tenant), decide
// liveness any other way than storage's read path, or load anything from
// the network.
package ui
