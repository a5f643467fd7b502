// Package drainreq is the operators' drain requests: an operator asks some workers to
// take no new work (docs/operations.md, "Maintenance and upgrades: drain"). The requests
// are one hash per namespace (event.Topology.Drains): a field per target (Target.Field),
// its value the JSON of a Request. Every router (pipeline) reads it with each presence
// beat, and a worker started while a request for it stands starts drained; each
// subscription reports its drain state in its presence record (presence.Beat.Drain).
// The operator's views (inspect) write and read it: an implementation detail of those
// two, not part of the library's surface (inspect names Target and Request for its
// callers).
//
// Files: doc.go (this comment), drainreq.go (targets, requests, the hash's fields).
package drainreq
