package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/delayq"
	"github.com/ymirflow/ymirflow/internal/streamid"
)

// The busy policies' part of the invariants. An event that meets a busy issue ends with
// one record (lock.dropped, lock.coalesced, lock.delayed or lock.delivered: check 1);
// what it leaves behind must then be accounted for:
//   - delay: its copy is appended to its stream again (m:delayed_from names the entry)
//     exactly once, never before the record's delayed_until, and that copy has a
//     terminal record of its own (check 1 again); no member is left in a delayed set;
//   - deliver: the follow-up it became is delivered to a live run (followup.delivered),
//     rolled into the next run's Task JSON (followup.rolled), or dead-lettered: exactly
//     one of them.

// policyReport counts what became of delayed events and follow-ups.
type policyReport struct {
	promoted                      int // delayed copies appended again
	followDelivered, followRolled int
	followDuplicates              []string // a second follow-up record after a SIGKILL
}

func (p policyReport) String() string {
	if p.promoted == 0 && p.followDelivered == 0 && p.followRolled == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d delayed copies appended again; follow-ups: %d delivered to a live run, %d rolled into the next run)",
		p.promoted, p.followDelivered, p.followRolled)
}

// readPolicies reads the delayed sets and indexes the delayed copies among st.entries.
func (st *state) readPolicies(ctx context.Context, rdb redis.Cmdable) error {
	st.promoted, st.followupsOf, st.delayedLeft = map[string][]streamEntry{}, map[string][]redis.XMessage{}, map[string]int64{}
	for _, r := range topo.AllInputs() {
		n, err := rdb.ZCard(ctx, delayq.Key(r.Stream)).Result()
		if err != nil {
			return fmt.Errorf("ZCARD %s: %w", delayq.Key(r.Stream), err)
		}
		if n > 0 {
			st.delayedLeft[r.Stream] = n
		}
	}
	for _, e := range st.entries {
		if from := str(e.values["m:"+event.MetaDelayedFrom]); from != "" {
			k := e.stream + " " + from
			st.promoted[k] = append(st.promoted[k], e)
		}
	}
	return nil
}

// followupDetail is the detail of a followup.delivered or followup.rolled record.
type followupDetail struct {
	ID        string `json:"followup_id"`
	MessageID string `json:"followup_message_id"`
	EventType string `json:"followup_event_type"`
}

// indexFollowup files m under the follow-up it accounts for, when it is a follow-up
// record: by agent and the follow-up's entry id (a lease's mailbox is its agent's).
func (st *state) indexFollowup(m redis.XMessage) {
	et := str(m.Values["event_type"])
	if et != event.FollowupDelivered && et != event.FollowupRolled {
		return
	}
	var d followupDetail
	_ = json.Unmarshal([]byte(str(m.Values["detail"])), &d)
	k := str(m.Values["agent"]) + " " + d.MessageID
	st.followupsOf[k] = append(st.followupsOf[k], m)
}

// policiesSettled reports whether every delayed event has been appended again and
// every follow-up accounted for.
func (st *state) policiesSettled() (bool, string) {
	for stream, n := range st.delayedLeft {
		return false, fmt.Sprintf("%d events still delayed in %s", n, stream)
	}
	for _, e := range st.entries {
		for _, r := range st.resultsOf[e.key()] {
			switch str(r.Values["event_type"]) {
			case event.LockDelayed:
				if len(st.promoted[e.key()]) == 0 {
					return false, fmt.Sprintf("delayed %s %s (%s) not appended again yet", e.stream, e.id, e.issue)
				}
			case event.LockDelivered:
				if len(st.followupsOf[e.route.Agent+" "+e.id]) == 0 && len(st.deadOf[e.key()]) == 0 {
					return false, fmt.Sprintf("follow-up %s %s (%s) not accounted for yet", e.stream, e.id, e.issue)
				}
			}
		}
	}
	return true, ""
}

// checkPolicies checks the delayed copies and the follow-ups (see the top of the file).
func checkPolicies(st *state, runs []run, kills []time.Time, o checkOptions, rep *report, v func(string, ...any)) {
	for stream, n := range st.delayedLeft {
		v("%d events left in the delayed set of %s", n, stream)
	}
	byEntry := map[string]streamEntry{}
	for _, e := range st.entries {
		byEntry[e.key()] = e
	}
	for k, ps := range st.promoted {
		from, ok := byEntry[k]
		if !ok {
			v("delayed copies %v of an entry in no input stream: %s", ps, k)
			continue
		}
		checkPromoted(st, runs, o, from, ps, rep, v)
	}
	for _, e := range st.entries {
		checkFollowup(st, kills, o, e, rep, v)
	}
}

// checkPromoted checks the copies ps that the delayed set appended again for entry from:
// one, after its lock.delayed record's delayed_until (which is at least the policy's
// delay after the entry), and none of them run before it.
func checkPromoted(st *state, runs []run, o checkOptions, from streamEntry, ps []streamEntry, rep *report, v func(string, ...any)) {
	var rec redis.XMessage
	for _, r := range st.resultsOf[from.key()] {
		if str(r.Values["event_type"]) == event.LockDelayed {
			rec = r
		}
	}
	if rec.Values == nil {
		v("%s %s (%s) appended again without a lock.delayed record", from.stream, from.id, from.issue)
		return
	}
	if len(ps) != 1 {
		var ids []string
		for _, p := range ps {
			ids = append(ids, p.id)
		}
		v("%s %s (%s) delayed once, appended again %d times: %v", from.stream, from.id, from.issue, len(ps), ids)
	}
	rep.policy.promoted += len(ps)
	until, err := time.Parse(time.RFC3339Nano, str(rec.Values["delayed_until"]))
	if err != nil {
		v("%s %s: lock.delayed without a delayed_until: %s", from.stream, from.id, describe([]redis.XMessage{rec}))
		return
	}
	// The delay runs from the conflict, which came after the entry was appended.
	if until.Sub(from.at) < o.minDelay {
		v("%s %s delayed until %s after it was appended only, less than the policy's %s", from.stream, from.id,
			until.Sub(from.at), o.minDelay)
	}
	// The set is scored in ms: a copy appended in the ms it is due is on time.
	due := until.Truncate(time.Millisecond)
	for _, p := range ps {
		if p.at.Before(due) {
			v("%s %s (%s) appended again as %s, %s before its delayed_until %s", from.stream, from.id, from.issue,
				p.id, due.Sub(p.at), until.Format("15:04:05.000"))
		}
		for _, r := range runs {
			if r.msgID == p.id && r.agent == p.route.Agent && r.start.Before(until) {
				v("the delayed copy %s of %s ran %s before its delayed_until: %s", p.id, from.id, until.Sub(r.start), r)
			}
		}
	}
}

// checkFollowup checks that entry e, when it was delivered to a mailbox, was accounted
// for once (twice only across a SIGKILL, tolerated by o.crashDuplicates), and counts how.
func checkFollowup(st *state, kills []time.Time, o checkOptions, e streamEntry, rep *report, v func(string, ...any)) {
	killedBetween := func(a, b time.Time) bool {
		for _, k := range kills {
			if !k.Before(a) && !k.After(b) {
				return true
			}
		}
		return false
	}
	delivered := false
	for _, r := range st.resultsOf[e.key()] {
		delivered = delivered || str(r.Values["event_type"]) == event.LockDelivered
	}
	fs := st.followupsOf[e.route.Agent+" "+e.id]
	what := fmt.Sprintf("%s %s (%s %s)", e.stream, e.id, e.eventType, e.issue)
	switch {
	case !delivered && len(fs) > 0:
		v("%s accounted for as a follow-up without a lock.delivered record: %s", what, describe(fs))
	case !delivered:
	case len(fs) == 0 && len(st.deadOf[e.key()]) == 0:
		v("follow-up %s never accounted for (neither delivered, rolled into a run nor dead-lettered)", what)
	case len(fs) > 1:
		// A run recorded it and its worker was SIGKILLed before the mailbox forgot
		// it: the re-run accounts for it again. At least once, never lost.
		if o.crashDuplicates && killedBetween(streamid.Time(fs[0].ID), streamid.Time(fs[len(fs)-1].ID)) {
			rep.policy.followDuplicates = append(rep.policy.followDuplicates, what+": "+describe(fs))
		} else {
			v("follow-up %s accounted for %d times: %s", what, len(fs), describe(fs))
		}
	}
	for _, f := range fs {
		if str(f.Values["event_type"]) == event.FollowupDelivered {
			rep.policy.followDelivered++
		} else {
			rep.policy.followRolled++
		}
	}
}
