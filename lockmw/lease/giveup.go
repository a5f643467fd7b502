package lease

// GiveUp ends the lease here, as MaxHold does for a wedged holder: its context is
// cancelled with cause (wrap ErrMaxHold's kind of reason: the holder, not Redis, says
// the run is stuck), the heartbeat stops extending it, and the holder's release (or
// its expiry at the TTL) frees the key; the event stays pending and is run again. No
// Redis step of its own: the same local end as MaxHold's, so no new transition for
// the model. Idempotent; it does nothing after the lease ended.
func (le *Lease) GiveUp(cause error) { le.end(cause) }
