package lease

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ymirflow/ymirflow/internal/xonce"
)

// A run's slots with its lease, in one script (standalone Redis; scripts/slots_lease.lua):
// AcquireOptions.Slots makes the lease's acquire, whatever its policy, the combined one:
// the lease and a slot of every limit key are taken together or not at all, and an
// event that finds a key full waits in its line (acked in that script) with nothing
// taken. The lease's extend renews the slots, and its release (release.lua, handoff.lua)
// frees them and hands each to its next waiter, in the same scripts. Each combined
// script is the lease script's own body, wrapped as a function the slots' step calls.
//
// The one exception is Redis Cluster (KeysCluster): a limit key's keys are in a hash
// slot of their own, never the lease's, and no script may touch two slots. There the
// middleware takes the slots first by TakeSlots, one script per limit key, gives them
// back when the lease is busy, and renews them beside the heartbeat (slots.go).
//
// The wait policy's releases (release_line*.lua) free the slots by slots_free.lua right
// after the lease's own script: those scripts are the line's, and a crash in between
// leaves the slots to expire with the lease's TTL, as a dead run's do.

//go:embed scripts/slots_lease.lua
var slotsLeaseLua string

// The tails of the combined scripts: the acquire's, and every release's (a Cluster
// drain reply, {3, ...}, changes nothing and frees nothing; never on standalone).
const (
	slotsAcquireTail = "return slots_acquire(lease_body)\n"
	slotsReleaseTail = "local r = lease_body()\nif r[1] ~= 3 then slots_release() end\nreturn r\n"
)

// withSlots are the combined scripts, by the lease script they wrap. Built with the
// package's variables, so that they are keyed by the scripts as they are before any
// test plants a defect; cheap, since each is joined on first use (newScript).
var withSlots = slotScripts()

// slotScript is the combined script that wraps sc.
func slotScript(sc script) script { return withSlots[sc] }

// slotScripts builds the combined scripts (again, after a test planted a defect in a
// source: withSlots = slotScripts()).
func slotScripts() map[script]script {
	// The parts are joined on first use (newScript), not here: at start-up every
	// command of the binary would pay for the copies.
	wrap := func(prefix []string, body, tail string) script {
		return newScript(slices.Concat(prefix, []string{slotsLua, slotsLeaseLua, "local function lease_body()\n", body, "\nend\n", tail})...)
	}
	base, line, scoped := []string{xonce.IndexLua, leaseSteps}, []string{xonce.IndexLua, leaseSteps, lineLua}, []string{xonce.IndexLua, leaseSteps, lineLua, lineScopedLua}
	return map[script]script{
		acquireScript:             wrap(base, acquireLua, slotsAcquireTail),
		acquireScopedScript:       wrap(base, acquireScopedLua, slotsAcquireTail),
		acquireOrQueueScript:      wrap(base, acquireOrQueueLua, slotsAcquireTail),
		acquireOrDeliverScript:    wrap(base, acquireOrDeliverLua, slotsAcquireTail),
		acquireOrSupersede:        wrap(base, acquireOrSupersedeLua, slotsAcquireTail),
		acquireOrWaitScript:       wrap(line, acquireOrWaitLua, slotsAcquireTail),
		acquireOrWaitScopedScript: wrap(scoped, acquireOrWaitScopedLua, slotsAcquireTail),
		releaseScript:             wrap(base, releaseLua, slotsReleaseTail),
		handoffScript:             wrap(base, handoffLua, slotsReleaseTail),
	}
}

// errSlotsCluster refuses AcquireOptions.Slots where the slots cannot share the lease's
// script: Redis Cluster (TakeSlots there).
var errSlotsCluster = errors.New("lease: AcquireOptions.Slots needs standalone Redis (on Cluster, TakeSlots before the lease)")

// leaseSlots are the slots a lease holds (AcquireOptions.Slots): the limit keys, and
// the slots' KEYS and ARGV its scripts append to their own (slots_lease.lua).
type leaseSlots struct {
	limits []Limit
	keys   []string
	args   []any // from lid to the count, as the acquire sent them
	hold   time.Duration
	maxLen int64
	acked  bool // the acquire acks the event's entry when it waits (Ack given)
}

// newLeaseSlots lays out req's part of the combined scripts; takeover says the policy
// may take a lease another token holds (supersede, wait).
func (l *Locker) newLeaseSlots(req *SlotRequest, takeover bool) (*leaseSlots, error) {
	if l.opts.Format == KeysCluster {
		return nil, errSlotsCluster
	}
	if req.LineID == "" || req.Event.Stream == "" || len(req.Limits) == 0 {
		return nil, errors.New("lease: AcquireOptions.Slots needs Limits, LineID and Event.Stream")
	}
	rec, err := slotRecord(*req)
	if err != nil {
		return nil, err
	}
	s := &leaseSlots{limits: req.Limits, hold: req.Hold, maxLen: req.MaxLen}
	if s.hold <= 0 {
		s.hold = 2 * l.opts.TTL
	}
	lane := "2"
	if req.Priority {
		lane = "1"
	}
	group, id, acked := "", "", "0"
	for _, lim := range req.Limits {
		s.keys = append(s.keys, l.SlotKeys(lim.Key).list()...)
	}
	if req.Ack != nil {
		s.keys = append(s.keys, req.Ack.Stream)
		group, id, acked = req.Ack.Group, req.Ack.ID, "1"
		s.acked = true
	}
	over := "0"
	if takeover {
		over = "1"
	}
	s.args = []any{slotMember(*req), s.hold.Milliseconds(), lane, req.Fair, max(req.Weight, 1), req.MaxLen, indexMax, indexTTLms,
		slotsSeenTTL.Milliseconds(), rec, group, id, over, acked}
	for _, lim := range req.Limits {
		s.args = append(s.args, lim.N)
	}
	s.args = append(s.args, len(req.Limits))
	return s, nil
}

// holders are the holders keys of the lease's slots (extend.lua renews them).
func (s *leaseSlots) holders() []string {
	out := make([]string, 0, len(s.limits))
	for i := range s.limits {
		out = append(out, s.keys[6*i])
	}
	return out
}

// releaseParts are the slots' KEYS and ARGV for a release: no source stream, nothing
// acked.
func (s *leaseSlots) releaseParts() ([]string, []any) {
	args := append([]any(nil), s.args...)
	args[13] = "0"
	return s.keys[:6*len(s.limits)], args
}

// run sends the combined script of s (a lease script) with the slots' KEYS and ARGV
// after keys and args; a reply {4, ...} (a slot full: the event waits in its line) is
// a *SlotsWaitingError.
func (s *leaseSlots) run(ctx context.Context, rdb Client, sc script, keys []string, args []any) ([]any, error) {
	keys = append(append(make([]string, 0, len(keys)+len(s.keys)), keys...), s.keys...)
	args = append(append(make([]any, 0, len(args)+len(s.args)), args...), s.args...)
	res, err := slotScript(sc).Run(ctx, rdb, keys, args...).Slice()
	if err != nil {
		return nil, err
	}
	if len(res) >= 6 && atoi(res[0]) == 4 {
		i := int(atoi(res[1]))
		if i < 1 || i > len(s.limits) {
			return nil, fmt.Errorf("lease: take slots: unexpected reply %v", res)
		}
		return nil, &SlotsWaitingError{Limit: s.limits[i-1], Duplicate: atoi(res[2]) == 2, Position: atoi(res[3]),
			Used: atoi(res[4]), Waiting: atoi(res[5]), Acked: s.acked}
	}
	return res, nil
}

// withReleaseSlots turns runScript's args of a release script (nkeys KEYS then ARGV)
// into its combined script's: the slots' keys after the lease's, their ARGV after its.
func (s *leaseSlots) withReleaseSlots(sc script, nkeys int, args []any) (script, int, []any) {
	keys, sargs := s.releaseParts()
	out := make([]any, 0, len(args)+len(keys)+len(sargs))
	out = append(out, args[:3+nkeys]...)
	for _, k := range keys {
		out = append(out, k)
	}
	out = append(out, args[3+nkeys:]...)
	return slotScript(sc), nkeys + len(keys), append(out, sargs...)
}

// Slots are the limit keys whose slots the lease holds (AcquireOptions.Slots), none
// without.
func (le *Lease) Slots() []Limit {
	if le.slots == nil {
		return nil
	}
	return le.slots.limits
}

// freeSlotsApart frees the lease's slots by slots_free.lua, after a release whose
// script does not (the wait policy's line releases). A failure leaves them to expire
// with the lease's TTL.
func (le *Lease) freeSlotsApart(ctx context.Context) {
	if le.slots == nil {
		return
	}
	for _, lim := range le.slots.limits {
		if _, err := le.l.freeSlot(ctx, lim, le.slots.hold, le.slots.maxLen, le.token); err != nil {
			le.log().Warn().Err(err).Str("limit", lim.Key).Msg("could not free the run's slot; it frees at its expiry, the lease's TTL")
		}
	}
}
