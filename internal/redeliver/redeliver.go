// Package redeliver holds the one sentinel that the lease middleware, the pipeline and
// the handlers share to say "not this event's fault: leave it pending and deliver it
// again". It imports only the standard library, so any layer can use it.
package redeliver

import "errors"

// ErrTransient marks a failure that a later delivery may not meet (Redis unreachable,
// a dependency down): the pipeline leaves the event pending for redelivery, never
// dead-letters it, and counts no attempt for it. lockmw wraps its Redis failures in
// it; a handler wraps its own (errors.Join(redeliver.ErrTransient, err)) for the same
// treatment.
var ErrTransient = errors.New("transient failure, redeliver")
