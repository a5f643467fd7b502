// Package presence is the worker presence record: each router says, every Interval,
// which consumers it reads as (a Beat per subscription in the namespace's set,
// event.Topology.Workers), so that the operator's views can tell a live idle worker
// from a dead one. The router (pipeline) writes it and the operator's views (inspect,
// web) read it: an implementation detail of those, not part of the library's surface.
//
// Files: doc.go (this comment), presence.go (the record and its timing).
package presence
