package lockmw

import (
	"context"
	"fmt"
	"time"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redeliver"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// The pause check (issue 38): after an event's lease is taken, and before its run
// starts, the pauses are read (lease.Pauses.Check): an event of a paused scope gives
// its lease back and waits in the pause's line, acked (in the script that parks it on
// standalone Redis, after it on Cluster: a repeat is recognised), not dropped and not
// dead-lettered; a resume appends it to its stream again, in stream order. Checking
// after the acquire is what makes a pause final for every run not already past its
// check: such a run holds its lease when the pause is written, so the operator's
// listing of the scope's leases after the pause names it (lease/pause.go).
//
// A lease taken ahead in a batch had its check made in the batch's script, after its
// acquire (lease.Pending.PauseChecked), when no pause existed and its entry was never
// parked: it costs no round trip here. Unless its lease was lost since (a pause's
// --stop-running force-releases the leases it lists): the check is made then, and
// parks the event.

// pauseParked reports whether the event under le was parked by a pause (or is a repeat
// of one parked): its lease is given back and its entry acked, and it is not run. With
// no Config.Pauses, or no stream entry, nothing is checked.
func (m *Middleware) pauseParked(d *delivery, le *lease.Lease) (bool, error) {
	if m.cfg.Pauses == nil || !d.hasEntry {
		return false, nil
	}
	// Held, not the context alone: a loss being ended (its context not yet cancelled)
	// is a loss already.
	if d.pauseChecked && le.Held() {
		return false, nil
	}
	lid, isCopy := d.msg.Metadata.Get(lease.MetaParkedFrom), true
	if lid == "" {
		lid, isCopy = d.entry.ID, false
	}
	t := lease.PauseTarget{Agent: m.cfg.Agent, Branch: m.cfg.Branch, Issue: le.Issue(), Payload: d.msg.Payload, Meta: d.msg.Metadata.Get}
	e := lease.ParkEntry{Stream: d.entry.Stream, Group: d.entry.Group, ID: d.entry.ID, LineID: lid, Copy: isCopy,
		Issue: le.Issue(), Ack: true, Fields: func() (map[string]any, error) {
			cp := d.msg.Copy()
			cp.Metadata.Set(lease.MetaParkedFrom, lid)
			delete(cp.Metadata, event.MetaFence)
			return m.cfg.Source.Encode(cp)
		}}
	res, err := m.cfg.Pauses.Check(d.ctx, t, e)
	if err != nil {
		// Unknown whether a pause holds it: not run, left pending for redelivery.
		_ = le.GiveBack(context.WithoutCancel(d.ctx))
		return true, fmt.Errorf("%w: %w", redeliver.ErrTransient, err)
	}
	if res.Verdict == lease.Run {
		return false, nil
	}
	cleanup, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), 5*time.Second)
	defer cancel()
	if err := le.Park(cleanup); err != nil {
		d.log.get().Warn().Err(err).Msg("could not give back the lease of a parked event; it expires by its TTL")
	}
	if !res.Acked {
		pipe := m.cfg.Locker.Client().Pipeline()
		m.ack(cleanup, d.entry)(pipe)
		if _, err := pipe.Exec(cleanup); err != nil {
			// Parked already: its redelivery is recognised (Repeat) and acked then.
			return true, fmt.Errorf("%w: ack the parked entry %s: %w", redeliver.ErrTransient, d.entry.ID, err)
		}
	}
	m.cfg.Source.Settle(d.entry)
	if res.Verdict == lease.ParkedNow {
		d.log.get().Info().Str("pause", res.Scope).Int64("position", res.Position).
			Msg("scope paused: event parked in the pause's line; it runs when the scope is resumed")
	} else {
		d.log.get().Info().Msg("a repeat of an event parked by a pause; acked, not run")
	}
	return true, nil
}
