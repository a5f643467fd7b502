// Package delayq is the delayed set of the busy policy delay: an event whose issue is
// busy is acked and kept in its stream's delayed set, a sorted set scored by the time
// (ms) it is due; Promote appends the due ones to the stream again, each once, removing
// it in the same step: nothing is lost between them, and nothing is appended twice. The
// set lives in the stream's hash slot.
//
// The lock middleware (lockmw) fills the set, the router (pipeline) promotes it and the
// operator's views (inspect) list it; the event's metadata it keeps (event.MetaDelays,
// event.MetaDelayedFrom) are the wire format's. An implementation detail of those three,
// not part of the library's surface.
//
// Files: doc.go (this comment); delayq.go (the set, its members, Promote and the
// listing) and the scripts it runs, scripts/due.lua (the due members, by the server's
// clock) and scripts/now.lua (that clock).
package delayq
