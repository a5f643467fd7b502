// Package audit is the operators' trail: every write an operator makes to the pipeline
// (force release, replay, requeue, purge, budget approve, and any later one) goes
// through Log.Do, which appends who, what (the action and its exact scope), why, when and
// from where to the audit stream before the action runs. A write whose record cannot be
// appended does not run (ErrNotRecorded). A refused write (a viewer's, say) is recorded
// too (Log.Refused).
//
// The stream is <namespace>:audit (event.Topology.Audit). Each record is filed in the
// index of every issue it names (xonce.IndexKey's form), so an issue's history shows the
// operator actions on it beside its events.
package audit
