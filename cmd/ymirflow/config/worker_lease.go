package config

import (
	"flag"
	"time"

	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
	"github.com/ymirflow/ymirflow/runners"
)

// given reports whether a flag was set on the command line or by its environment
// variable. Settings of a Worker built by hand (no Register) all count as given.
func (w *Worker) given(flagName string) bool {
	if w.fs == nil {
		return true
	}
	set := false
	w.fs.Visit(func(f *flag.Flag) { set = set || f.Name == flagName })
	return set
}

// derive fills the lease-related settings that were not given from those that were,
// so that a setting given alone never trips a relation with a default:
//
//	LOCK_TTL      = 300s, at least 10×KILL_GRACE, at most LOCK_MAX_HOLD and 2×MAX_IDLE_TIME
//	KILL_GRACE    = min(10s, LOCK_TTL/10)     the lease's safety margin must cover it
//	MAX_IDLE_TIME = max(3m, LOCK_TTL/2)       must exceed the heartbeat, LOCK_TTL/3
//	LOCK_MAX_HOLD = max(6h, LOCK_TTL)
//
// Values outside their documented range are left as they are (Validate refuses them).
func (w *Worker) derive() {
	in := func(name string, d time.Duration) bool { return w.given(name) && inRange(name, d) }
	if !w.given("lock-ttl") {
		ttl := lease.DefaultTTL
		if in("kill-grace", w.KillGrace) {
			ttl = max(ttl, 10*w.KillGrace)
		}
		if in("lock-max-hold", w.LockMaxHold) {
			ttl = min(ttl, w.LockMaxHold)
		}
		if in("max-idle-time", w.MaxIdleTime) {
			ttl = min(ttl, 2*w.MaxIdleTime)
		}
		w.LockTTL = ttl
	}
	if !w.given("kill-grace") {
		w.KillGrace = max(min(runners.DefaultKillGrace, lease.DefaultSafetyMargin(w.LockTTL)), time.Millisecond)
	}
	if !w.given("max-idle-time") {
		w.MaxIdleTime = max(pipeline.DefaultMaxIdleTime, w.LockTTL/2)
	}
	if !w.given("lock-max-hold") {
		w.LockMaxHold = max(lease.DefaultMaxHold, w.LockTTL)
	}
}

// validateLease checks the relations between the lease settings. After derive they can
// only fail between settings that were both given (or LOCK_TTL derived from two given
// ones that contradict each other), and the message names the settings involved.
func (w *Worker) validateLease(p *problems) {
	if !inRange("lock-ttl", w.LockTTL) {
		return // refused by its range already
	}
	ttl := "LOCK_TTL (--lock-ttl) is " + fmtDur(w.LockTTL)
	if !w.given("lock-ttl") {
		ttl = "LOCK_TTL (--lock-ttl) is not set and was derived as " + fmtDur(w.LockTTL) + " from the settings given"
	}
	if inRange("lock-max-hold", w.LockMaxHold) && w.LockMaxHold < w.LockTTL {
		p.add("lock-max-hold", "= %s must be at least LOCK_TTL = %s; %s", fmtDur(w.LockMaxHold), fmtDur(w.LockTTL), ttl)
	}
	if hb := lease.HeartbeatFor(w.LockTTL); inRange("max-idle-time", w.MaxIdleTime) && w.MaxIdleTime <= hb {
		p.add("max-idle-time", "= %s must exceed the lease heartbeat interval LOCK_TTL/3 = %s; %s",
			fmtDur(w.MaxIdleTime), fmtDur(hb), ttl)
	}
	if margin := lease.DefaultSafetyMargin(w.LockTTL); inRange("kill-grace", w.KillGrace) && w.KillGrace > margin {
		// The lease gives up LOCK_TTL/10 before its key can expire; a runner that ignores
		// SIGTERM must be dead by then, or it could still work when a new holder starts.
		p.add("kill-grace", "= %s must not exceed LOCK_TTL/10 = %s (the lease's safety margin); %s",
			fmtDur(w.KillGrace), fmtDur(margin), ttl)
	}
}
