package pipeline

// Books is how many entries the router's subscriptions count as their own: read and
// not ended (in flight), and waiting in their queues. Once every entry is handled both
// must be zero: an entry left there would have the worker believe that an event still
// runs long (offer-back, reading held) for good.
func (r *Router) Books() (inflight, queued int) {
	for _, s := range r.subs {
		s.mu.Lock()
		inflight += len(s.inflight)
		queued += len(s.queue)
		s.mu.Unlock()
	}
	return inflight, queued
}
