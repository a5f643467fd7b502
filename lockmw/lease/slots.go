package lease

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/xonce"
)

// Concurrency limits (scripts/slots*.lua): at most N runs at once per limit key (an
// agent's, or one value of an event field's), across every worker. A run takes a slot
// of each of its limit keys: on standalone Redis with its lease, in the lease's own
// acquire script (AcquireOptions.Slots, slots_lease.go); on Redis Cluster before its
// lease, by TakeSlots below (the limit keys' hash slots are never the lease's, and a
// script touches one hash slot). An event that finds a key full waits in
// that key's line (acked in the same script on standalone Redis, so no release can miss
// it) in a fair order: the priority lane (a :todo stream) first, then the values of a
// fairness field in weighted turns. The run's end frees its slots, and the script that
// frees one hands it to the next waiter and appends the waiter's copy to its stream.
// A slot whose holder died frees when its lease would have expired (the holders are a
// sorted set by expiry, renewed with the heartbeat). See docs/architecture.md.
//
// Each limit key is in a hash slot of its own ({<scope><limit key>}): TakeSlots (Redis
// Cluster) takes several limit keys one after the other, in a fixed order, each by its
// own script. A take that ends waiting gives back the slots taken before it in the same
// call (compensation); a crash in between leaves them to their expiry, the lease TTL.
// On standalone Redis the combined acquire checks them all before it takes any: no
// compensation there.

var (
	//go:embed scripts/slots.lua
	slotsLua string
	//go:embed scripts/slots_take.lua
	slotsTakeLua string
	//go:embed scripts/slots_free.lua
	slotsFreeLua string
	//go:embed scripts/slots_renew.lua
	slotsRenewLua string

	slotsTakeScript = newScript(xonce.IndexLua, leaseSteps, slotsLua, slotsTakeLua)
	slotsFreeScript = newScript(xonce.IndexLua, leaseSteps, slotsLua, slotsFreeLua)
	// slots_renew.lua is sent by EVAL on the heartbeat's pipeline (small; no NOSCRIPT
	// round trip to handle inside a pipeline).
)

// ErrSlotsFull is wrapped by *SlotsWaitingError: a limit key had no free slot; the event
// waits in its line.
var ErrSlotsFull = errors.New("lease: no free slot under the run limit")

// SlotsWaitingError says an event waits for a slot of Limit: it is in the key's line
// (Acked: its entry was acked in the same script), Position its place (1 the next).
type SlotsWaitingError struct {
	Limit     Limit
	Position  int64
	Used      int64
	Waiting   int64
	Duplicate bool // it waited already (a redelivery of its entry)
	Acked     bool
}

func (e *SlotsWaitingError) Error() string {
	return fmt.Sprintf("%v: %s has %d of %d slots used; waits at place %d of %d", ErrSlotsFull, e.Limit.Key, e.Used,
		e.Limit.N, e.Position, e.Waiting)
}

func (e *SlotsWaitingError) Unwrap() error { return ErrSlotsFull }

// Limit is one limit key and how many runs it allows at once.
type Limit struct {
	Key string // "agent:rebase", "field:metadata.component=KERNEL"
	N   int64
}

// SlotKeys are the Redis keys of one limit key (scripts/slots.lua), in one hash slot.
type SlotKeys struct {
	Holders, Wait1, Wait2, Recs, Meta, Handed string
}

func (k SlotKeys) list() []string {
	return []string{k.Holders, k.Wait1, k.Wait2, k.Recs, k.Meta, k.Handed}
}

// SlotKeys returns the keys of limit key key.
func (l *Locker) SlotKeys(key string) SlotKeys {
	tag := "{" + l.opts.Scope + key + "}"
	// Under the lease's own "lock" prefix: the deployed users' key patterns (~lock*)
	// cover them.
	return SlotKeys{Holders: "lockslots:" + tag, Wait1: "lockslotwait:" + tag + ":1", Wait2: "lockslotwait:" + tag + ":2",
		Recs: "lockslotrec:" + tag, Meta: "lockslotmeta:" + tag, Handed: "lockslothanded:" + tag}
}

// SlotRequest is what a run asks of TakeSlots.
type SlotRequest struct {
	// Limits are the event's limit keys, taken in this order. Required (none: nothing
	// to take).
	Limits []Limit
	// LineID names the event in the lines: the stream entry it first had (its copies
	// keep it). Required.
	LineID string
	// Issue is the event's issue key (the copy is filed in the issue's index).
	Issue string
	// Priority puts the event in the priority lane (it came from a :todo stream).
	Priority bool
	// Fair is the event's value of the fairness field ("" when it has none) and Weight
	// that value's weight (at least 1: a value of weight 2 gets two turns to one's).
	Fair   string
	Weight int64
	// Event is the copy appended when a waiting event's turn comes; it must name
	// LineID (the caller's metadata). Required.
	Event QueuedEvent
	// Ack, on standalone Redis, is the event's entry: acked in the script that puts the
	// event in a line. On Cluster the caller acks.
	Ack *Entry
	// Hold is how long a slot handed to a waiter waits for its copy. Default: 2×TTL.
	Hold time.Duration
	// MaxLen trims the stream a copy is appended to (approximate). Default: 0.
	MaxLen int64
}

// Slots are the slots one run holds (TakeSlots), until Release.
type Slots struct {
	l      *Locker
	token  string
	lid    string
	limits []Limit
	hold   time.Duration
	maxLen int64
	mu     sync.Mutex
	done   bool
}

// Limits are the limit keys the slots are held on.
func (s *Slots) Limits() []Limit { return s.limits }

// slotsSeenTTL is how long a line's keys live after their last write.
const slotsSeenTTL = 7 * 24 * time.Hour

func (l *Locker) mode() string {
	if l.opts.Format == KeysCluster {
		return modeCluster
	}
	return modeStandalone
}

// TakeSlots takes a slot of each of req.Limits for one run, or puts the event in the
// line of the first that is full (a *SlotsWaitingError) and gives back those taken
// before it, and any slot handed to the event on a later key (its copy takes them all
// again when its turn comes). An error of Redis gives back what was taken (best effort:
// what a failure keeps frees at its expiry).
func (l *Locker) TakeSlots(ctx context.Context, req SlotRequest) (*Slots, error) {
	if req.LineID == "" || req.Event.Stream == "" {
		return nil, errors.New("lease: TakeSlots needs LineID and Event.Stream")
	}
	hold := req.Hold
	if hold <= 0 {
		hold = 2 * l.opts.TTL
	}
	s := &Slots{l: l, token: newToken(), lid: slotMember(req), hold: hold, maxLen: req.MaxLen}
	rec, err := slotRecord(req)
	if err != nil {
		return nil, err
	}
	for i, lim := range req.Limits {
		res, err := l.takeSlot(ctx, s, req, lim, rec)
		if err != nil {
			s.limits = append(s.limits, lim) // a lost reply may have taken it
			s.giveBack(context.WithoutCancel(ctx), req.Limits[i+1:])
			return nil, err
		}
		if atoi(res[0]) == 1 {
			s.limits = append(s.limits, lim)
			continue
		}
		werr := slotsWaiting(res, lim, req.Ack != nil && l.opts.Format != KeysCluster)
		l.publishHanded(ctx, lim.Key, res[5:])
		s.giveBack(context.WithoutCancel(ctx), req.Limits[i+1:])
		return nil, werr
	}
	return s, nil
}

func (l *Locker) takeSlot(ctx context.Context, s *Slots, req SlotRequest, lim Limit, rec string) ([]any, error) {
	lane := "2"
	if req.Priority {
		lane = "1"
	}
	keys := l.SlotKeys(lim.Key).list()
	group, id := "", ""
	if req.Ack != nil && l.opts.Format != KeysCluster {
		keys = append(keys, req.Ack.Stream)
		group, id = req.Ack.Group, req.Ack.ID
	}
	res, err := slotsTakeScript.Run(ctx, l.rdb, keys, s.token, s.lid, lim.N, l.ttlMS, s.hold.Milliseconds(), lane,
		req.Fair, max(req.Weight, 1), l.mode(), req.MaxLen, indexMax, indexTTLms, slotsSeenTTL.Milliseconds(), rec,
		group, id).Slice()
	if err != nil {
		return nil, fmt.Errorf("lease: take a slot of %s: %w", lim.Key, err)
	}
	if len(res) < 2 || (atoi(res[0]) == 0 && len(res) < 5) {
		return nil, fmt.Errorf("lease: take a slot of %s: unexpected reply %v", lim.Key, res)
	}
	return res, nil
}

func slotsWaiting(res []any, lim Limit, acked bool) *SlotsWaitingError {
	return &SlotsWaitingError{Limit: lim, Duplicate: atoi(res[1]) == 2, Position: atoi(res[2]), Used: atoi(res[3]),
		Waiting: atoi(res[4]), Acked: acked}
}

// slotMember is the member of a limit's lines that req's event is (member).
func slotMember(req SlotRequest) string { return member(req.LineID, req.Event.Stream) }

// slotRecord is the waiting event's record: {member (slotMember), joined_ms (0: the
// server's time is not needed), issue, '_stream', stream, field, value, ...}.
func slotRecord(req SlotRequest) (string, error) {
	e := []any{slotMember(req), time.Now().UnixMilli(), req.Issue, "_stream", req.Event.Stream}
	for k, v := range req.Event.Fields {
		e = append(e, k, v)
	}
	b, err := json.Marshal(e)
	if err != nil {
		return "", fmt.Errorf("lease: encode the waiting event: %w", err)
	}
	return string(b), nil
}

// giveBack frees the slots s took, and a slot handed to the event on any of later (it
// is in no line any more once it waits elsewhere). Failures are left to the expiry.
func (s *Slots) giveBack(ctx context.Context, later []Limit) {
	_ = s.Release(ctx)
	for _, lim := range later {
		_, _ = s.l.freeSlot(ctx, lim, s.hold, s.maxLen, "w:"+s.lid)
	}
}

// Release frees the run's slots, each handed to its key's next waiter in the same
// script. It is idempotent; a failure leaves the slot to its expiry (the lease TTL after
// the last renewal).
func (s *Slots) Release(ctx context.Context) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		return nil
	}
	s.done = true
	s.mu.Unlock()
	var errs []error
	for _, lim := range s.limits {
		if _, err := s.l.freeSlot(ctx, lim, s.hold, s.maxLen, s.token); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Renew moves the expiry of the run's slots to a lease TTL from now (server time): the
// run's heartbeat. It reports how many are still the run's.
func (s *Slots) Renew(ctx context.Context) (int, error) {
	pipe := s.l.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(s.limits))
	for i, lim := range s.limits {
		cmds[i] = pipe.Eval(ctx, slotsRenewLua, []string{s.l.SlotKeys(lim.Key).Holders}, s.token, s.l.ttlMS)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("lease: renew slots: %w", err)
	}
	n := 0
	for _, c := range cmds {
		n += int(atoi(c.Val()))
	}
	return n, nil
}

// SlotSweep is what WakeSlots did on one limit key.
type SlotSweep struct {
	Handed        int
	Used, Waiting int64
}

// freeSlot runs slots_free.lua for holders (none: a wake) and appends what it handed
// (Cluster).
func (l *Locker) freeSlot(ctx context.Context, lim Limit, hold time.Duration, maxLen int64, holders ...string) (SlotSweep, error) {
	args := []any{lim.N, l.ttlMS, hold.Milliseconds(), l.mode(), maxLen, indexMax, indexTTLms,
		slotsSeenTTL.Milliseconds()}
	for _, h := range holders {
		args = append(args, h)
	}
	res, err := slotsFreeScript.Run(ctx, l.rdb, l.SlotKeys(lim.Key).list(), args...).Slice()
	if err != nil {
		return SlotSweep{}, fmt.Errorf("lease: free a slot of %s: %w", lim.Key, err)
	}
	if len(res) < 3 {
		return SlotSweep{}, fmt.Errorf("lease: free a slot of %s: unexpected reply %v", lim.Key, res)
	}
	l.publishHanded(ctx, lim.Key, res[3:])
	return SlotSweep{Handed: len(res) - 3, Used: atoi(res[1]), Waiting: atoi(res[2])}, nil
}

// WakeSlots hands the free slots of lim (freed by a holder's expiry) to its waiters,
// and on Redis Cluster appends the copies a crash left unappended. Safe from any worker
// at any time.
func (l *Locker) WakeSlots(ctx context.Context, lim Limit, hold time.Duration, maxLen int64) (SlotSweep, error) {
	if hold <= 0 {
		hold = 2 * l.opts.TTL
	}
	sw, err := l.freeSlot(ctx, lim, hold, maxLen)
	if err != nil || l.opts.Format != KeysCluster {
		return sw, err
	}
	pipe := l.rdb.Pipeline()
	vals := pipe.HVals(ctx, l.SlotKeys(lim.Key).Handed)
	_, _ = pipe.Exec(ctx)
	left, err := vals.Result()
	if err != nil {
		return sw, fmt.Errorf("lease: read %s: %w", l.SlotKeys(lim.Key).Handed, err)
	}
	recs := make([]any, len(left))
	for i, r := range left {
		recs[i] = r
	}
	l.publishHanded(ctx, lim.Key, recs)
	return sw, nil
}

// publishHanded appends the copies of the waiters handed a slot whose stream is in
// another hash slot (Redis Cluster), each once (xonce, by lid and joining), then takes
// them off the key's handed hash. A failure leaves them there for WakeSlots. Nothing to
// do on standalone Redis (the script appended them).
func (l *Locker) publishHanded(ctx context.Context, key string, recs []any) {
	if l.opts.Format != KeysCluster {
		return
	}
	handed := l.SlotKeys(key).Handed
	for _, r := range recs {
		var e []any
		if err := json.Unmarshal([]byte(fmt.Sprint(r)), &e); err != nil || len(e) < 5 {
			continue
		}
		lid := fmt.Sprint(e[0])
		issue, _ := e[2].(string)
		values, stream := map[string]any{}, ""
		for i := 3; i+1 < len(e); i += 2 {
			if k := fmt.Sprint(e[i]); k == "_stream" {
				stream = fmt.Sprint(e[i+1])
			} else {
				values[k] = e[i+1]
			}
		}
		joined := strconv.FormatFloat(toFloat(e[1]), 'f', 0, 64)
		if _, err := xonce.Run(ctx, l.rdb, xonce.Append{Stream: stream, ID: "slot-" + handed + "-" + lid + "@" + joined,
			Issue: issue, Values: values, TTL: l.opts.MaxHold + l.opts.TTL}); err != nil {
			l.opts.Logger.Warn().Err(err).Str("limit", key).Str("lid", lid).Msg("could not append a waiter's copy; the slot waker tries again")
			continue
		}
		pipe := l.rdb.Pipeline()
		pipe.HDel(ctx, handed, lid)
		if _, err := pipe.Exec(ctx); err != nil {
			l.opts.Logger.Warn().Err(err).Str("limit", key).Msg("could not clear a handed waiter; the waker appends it again, once")
		}
	}
}

func toFloat(v any) float64 {
	f, _ := v.(float64)
	return f
}

// SlotUsage is one limit key as operators see it (`locks`, the console).
type SlotUsage struct {
	Key           string
	Used, Limit   int64
	Waiting       int64
	Priority      int64 // of Waiting, in the priority lane
	OldestWaiting time.Time
}

// SlotUsages returns every limit key that has holders or waiters (SCAN; every master's
// on Cluster), sorted by key.
func (l *Locker) SlotUsages(ctx context.Context) ([]SlotUsage, error) {
	prefix := "lockslotmeta:{" + l.opts.Scope
	var mu sync.Mutex
	var keys []string
	scan := func(ctx context.Context, c Client) error {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			keys = append(keys, strings.TrimSuffix(strings.TrimPrefix(iter.Val(), prefix), "}"))
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	if cc, ok := l.rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, l.rdb)
	}
	if err != nil {
		return nil, fmt.Errorf("lease: scan %s*: %w", prefix, err)
	}
	out := make([]SlotUsage, 0, len(keys))
	for _, k := range keys {
		u, err := l.SlotUsage(ctx, k)
		if err != nil {
			return nil, err
		}
		if u.Used > 0 || u.Waiting > 0 {
			out = append(out, u)
		}
	}
	slices.SortFunc(out, func(a, b SlotUsage) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// SlotUsage reads one limit key: its live holders (by their expiry, server time), its
// limit (the last a take named), and its waiters.
func (l *Locker) SlotUsage(ctx context.Context, key string) (SlotUsage, error) {
	k := l.SlotKeys(key)
	pipe := l.rdb.Pipeline()
	t := pipe.Time(ctx)
	holders := pipe.ZRangeWithScores(ctx, k.Holders, 0, -1)
	lim := pipe.HGet(ctx, k.Meta, "limit")
	w1 := pipe.ZCard(ctx, k.Wait1)
	w2 := pipe.ZCard(ctx, k.Wait2)
	recs := pipe.HVals(ctx, k.Recs)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return SlotUsage{}, fmt.Errorf("lease: read %s: %w", k.Holders, err)
	}
	now := float64(t.Val().UnixMilli())
	u := SlotUsage{Key: key, Priority: w1.Val(), Waiting: w1.Val() + w2.Val()}
	u.Limit, _ = strconv.ParseInt(lim.Val(), 10, 64)
	for _, h := range holders.Val() {
		if h.Score > now {
			u.Used++
		}
	}
	for _, r := range recs.Val() {
		var e []any
		if json.Unmarshal([]byte(r), &e) == nil && len(e) > 1 {
			if ms := int64(toFloat(e[1])); ms > 0 && (u.OldestWaiting.IsZero() || time.UnixMilli(ms).Before(u.OldestWaiting)) {
				u.OldestWaiting = time.UnixMilli(ms)
			}
		}
	}
	return u, nil
}
