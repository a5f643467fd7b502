package lockmw

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redeliver"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// Concurrency limits (RUN_LIMITS, lease/slots.go): a run takes a slot of each limit key
// that applies to its event (its agent's, and one per limited field's value); an event
// that finds one full waits in that key's line, fairly, and its copy comes back to its
// stream when a slot is handed to it. On standalone Redis the slots are taken with the
// lease, in its acquire's one script, renewed by its heartbeat and freed by its release
// (lease/slots_lease.go). On Redis Cluster, the one exception, the slots are taken
// before the lease by scripts of their own (their keys are in other hash slots than the
// lease's), given back when the lease is busy, and renewed beside the heartbeat.

// MetaSlotFrom names, on the copy of an event that waited for a slot, the stream entry
// the event first had: every copy of one event is one member of the lines.
const MetaSlotFrom = "slot_from"

// Limits are the concurrency limits and the fair order of the events that wait for them.
type Limits struct {
	// Agents: at most N runs of the agent at once, across every worker.
	Agents map[string]int64
	// Fields: at most N runs at once per value of an event field (a payload path, or
	// m:<name> metadata, as group scopes name them), across agents.
	Fields []FieldLimit
	// FairField is the field whose values take turns in a line ("": first come, first
	// served within a lane), and Weights their turns (default 1).
	FairField string
	Weights   map[string]int64
}

// FieldLimit is at most N runs at once per value of the event field Path.
type FieldLimit struct {
	Path string
	N    int64
}

// Empty reports whether no limit is set.
func (l Limits) Empty() bool { return len(l.Agents) == 0 && len(l.Fields) == 0 }

// String is the RUN_LIMITS form.
func (l Limits) String() string {
	var parts []string
	for a, n := range l.Agents {
		parts = append(parts, a+"="+strconv.FormatInt(n, 10))
	}
	sort.Strings(parts)
	for _, f := range l.Fields {
		parts = append(parts, "field:"+f.Path+"="+strconv.FormatInt(f.N, 10))
	}
	return strings.Join(parts, ",")
}

// ParseLimits reads RUN_LIMITS, comma-separated items: AGENT=N (at most N runs of the
// agent at once), field:PATH=N (at most N at once per value of the event field PATH,
// e.g. field:metadata.component=1 or field:m:team=2), fair:PATH (the field whose values
// take turns among the events waiting for a slot) and weight:VALUE=W (W turns for that
// value to one for the others; values compared uppercased, as limit keys are).
func ParseLimits(s string) (Limits, error) {
	l := Limits{Agents: map[string]int64{}, Weights: map[string]int64{}}
	for _, item := range strings.Split(s, ",") {
		if err := l.parseItem(strings.TrimSpace(item)); err != nil {
			return Limits{}, err
		}
	}
	if len(l.Weights) > 0 && l.FairField == "" {
		return Limits{}, errors.New("weight:VALUE=W needs fair:PATH (the field whose values take turns)")
	}
	return l, nil
}

func (l *Limits) parseItem(item string) error {
	if item == "" {
		return nil
	}
	if path, ok := strings.CutPrefix(item, "fair:"); ok {
		if err := checkFieldPath(path); err != nil || l.FairField != "" {
			return fmt.Errorf("%q: one fair:PATH, a payload path like metadata.component or m:<metadata key>", item)
		}
		l.FairField = path
		return nil
	}
	name, num, ok := strings.Cut(item, "=")
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if !ok || err != nil || n < 1 {
		return fmt.Errorf("%q: want agent=N, field:PATH=N, fair:PATH or weight:VALUE=W with N, W at least 1", item)
	}
	name = strings.TrimSpace(name)
	if v, isWeight := strings.CutPrefix(name, "weight:"); isWeight {
		if v = strings.ToUpper(strings.TrimSpace(v)); v == "" || n > 1000 {
			return fmt.Errorf("%q: want weight:VALUE=W with W in [1, 1000]", item)
		}
		l.Weights[v] = n
		return nil
	}
	if path, isField := strings.CutPrefix(name, "field:"); isField {
		if err := checkFieldPath(path); err != nil {
			return fmt.Errorf("%q: bad field path %q (a payload path like metadata.component, or m:<metadata key>)", item, path)
		}
		l.Fields = append(l.Fields, FieldLimit{Path: path, N: n})
		return nil
	}
	if name == "" || strings.ContainsAny(name, " :{}") {
		return fmt.Errorf("%q: bad agent name %q", item, name)
	}
	if _, dup := l.Agents[name]; dup {
		return fmt.Errorf("%q: agent %s limited twice", item, name)
	}
	l.Agents[name] = n
	return nil
}

// checkFieldPath checks one field path as group scopes take them.
func checkFieldPath(path string) error {
	if path == "" || strings.Contains(path, "+") {
		return errors.New("bad path")
	}
	_, err := lease.ParseScopes("group:" + path)
	return err
}

// fieldValue is the canonical value of the event field path ("" when it has none).
func fieldValue(msg *message.Message, path string) string {
	keys, err := lease.Scopes{Group: []string{path}}.Keys("", msg.Payload, msg.Metadata.Get)
	if err != nil || len(keys) == 0 {
		return ""
	}
	return keys[0].Key
}

// limitsOf are the limit keys of msg under the middleware's agent, in a fixed order:
// the agent's, then the fields' in their order. A field the event does not have limits
// nothing.
func (m *Middleware) limitsOf(msg *message.Message) []lease.Limit {
	l := m.cfg.Limits
	var out []lease.Limit
	if n := l.Agents[m.cfg.Agent]; n > 0 {
		out = append(out, lease.Limit{Key: "agent:" + m.cfg.Agent, N: n})
	}
	for _, f := range l.Fields {
		if v := fieldValue(msg, f.Path); v != "" {
			out = append(out, lease.Limit{Key: "field:" + f.Path + "=" + v, N: f.N})
		}
	}
	return out
}

// slotHold is a run's slots on Redis Cluster, renewed with the lease's heartbeat
// interval until its end.
type slotHold struct {
	slots *lease.Slots
	stop  chan struct{}
	done  chan struct{}
}

// end stops the renewal and frees the slots (each handed to its next waiter). nil-safe.
func (h *slotHold) end(ctx context.Context) {
	if h == nil {
		return
	}
	close(h.stop)
	<-h.done
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = h.slots.Release(rctx)
}

func (m *Middleware) keepSlots(s *lease.Slots) *slotHold {
	h := &slotHold{slots: s, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		t := time.NewTicker(m.cfg.Locker.HeartbeatInterval())
		defer t.Stop()
		for {
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), m.cfg.Locker.HeartbeatInterval())
			_, err := s.Renew(ctx)
			cancel()
			if err != nil {
				m.cfg.Logger.Warn().Err(err).Str("agent", m.cfg.Agent).Msg("could not renew the run's slots; retrying at the next beat")
			}
		}
	}()
	return h
}

// slotLineID is the event's member of the slot lines: the entry it first had.
func slotLineID(msg *message.Message, entry Entry) string {
	if from := msg.Metadata.Get(MetaSlotFrom); from != "" {
		return from
	}
	return entry.ID
}

// slotRequest is the run's slot request: its limit keys, and the copy of its event
// that comes back when a slot is handed to it. nil when no limit applies.
func (m *Middleware) slotRequest(d *delivery, raw string) (*lease.SlotRequest, error) {
	if m.cfg.Limits.Empty() || !d.hasEntry {
		return nil, nil
	}
	limits := m.limitsOf(d.msg)
	if len(limits) == 0 {
		return nil, nil
	}
	lid := slotLineID(d.msg, d.entry)
	cp := d.msg.Copy()
	cp.Metadata.Set(MetaSlotFrom, lid)
	fields, err := m.cfg.Source.Encode(cp)
	if err != nil {
		return nil, err
	}
	fair := ""
	if m.cfg.Limits.FairField != "" {
		fair = fieldValue(d.msg, m.cfg.Limits.FairField)
	}
	issue, _ := m.cfg.Locker.Canonicalize(raw)
	return &lease.SlotRequest{Limits: limits, LineID: lid, Issue: issue,
		Priority: strings.HasSuffix(d.entry.Stream, ":todo"), Fair: fair, Weight: m.cfg.Limits.Weights[fair],
		Event: lease.QueuedEvent{Stream: d.entry.Stream, Fields: fields}, Hold: m.waitHold(),
		Ack: &lease.Entry{Stream: d.entry.Stream, Group: d.entry.Group, ID: d.entry.ID}}, nil
}

// takeSlots is the concurrency limits' step. On standalone Redis it only lays out the
// request (d.slots): the lease's acquire takes the slots with the lease, in one script.
// On Redis Cluster a limit key's keys are in a hash slot of their own, never the
// lease's, so it takes them here, before the lease, one script per key: the run's slots
// (nil when no limit applies), or settled when the event waits for one (acked: its copy
// comes back when a slot is handed to it).
func (m *Middleware) takeSlots(d *delivery, raw string) (*slotHold, bool, error) {
	req, err := m.slotRequest(d, raw)
	if err != nil || req == nil {
		return nil, false, err
	}
	if m.cfg.Locker.Format() != lease.KeysCluster {
		d.slots = req
		return nil, false, nil
	}
	s, err := m.cfg.Locker.TakeSlots(d.ctx, *req)
	var waiting *lease.SlotsWaitingError
	switch {
	case errors.As(err, &waiting):
		return nil, true, m.waitSlot(d, waiting)
	case err != nil:
		return nil, false, fmt.Errorf("%w: %w", redeliver.ErrTransient, err)
	}
	slotsTaken(d.ctx, s.Limits())
	return m.keepSlots(s), false, nil
}

// notTaken handles an acquire that took no lease: the event waits for a slot (the
// combined acquire found a limit key full), or notAcquired.
func (m *Middleware) notTaken(d *delivery, err error) error {
	var waiting *lease.SlotsWaitingError
	if d.slots != nil && errors.As(err, &waiting) {
		return m.waitSlot(d, waiting)
	}
	return m.notAcquired(d.ctx, d.msg, d.entry, d.hasEntry, err, d.log)
}

// waitSlot settles an event that waits for a slot: acked here on Redis Cluster (the
// script did on standalone), counted, and its span told.
func (m *Middleware) waitSlot(d *delivery, w *lease.SlotsWaitingError) error {
	if !w.Acked {
		pipe := m.cfg.Locker.Client().Pipeline()
		m.ack(d.ctx, d.entry)(pipe)
		if _, err := pipe.Exec(d.ctx); err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("%w: ack %s, which waits for a slot: %w", redeliver.ErrTransient, d.entry.ID, err)
		}
	}
	m.cfg.Source.Settle(d.entry)
	slotWaiting(d.ctx, w)
	m.cfg.Locker.Observer().Conflict(m.cfg.Agent, "waiting_slot", "limit")
	d.log.get().Info().Str("limit", w.Limit.Key).Int64("used", w.Used).Int64("limit_n", w.Limit.N).
		Int64("position", w.Position).Bool("duplicate", w.Duplicate).Msg("run limit reached; the event waits for a slot")
	return nil
}

// SlotObserver is implemented by a lease.Observer that also wants the limit keys, as
// each sweep of RunSlotWaker finds them: slots used, the limit, events waiting.
type SlotObserver interface {
	Slots(key string, used, limit, waiting int64)
}

// LimitsRun reports whether concurrency limits are set (RunSlotWaker then has work).
func (m *Middleware) LimitsRun() bool { return !m.cfg.Limits.Empty() }

// RunSlotWaker runs until ctx ends; every interval it hands out the slots that freed by
// themselves (a dead run's, at its lease's expiry; a hand-over whose copy never came)
// to the events waiting for them, appends the copies a crash left unappended (Redis
// Cluster), and tells a SlotObserver each limit key's usage. Any worker may run it.
func (m *Middleware) RunSlotWaker(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	seen := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		us, err := m.cfg.Locker.SlotUsages(ctx)
		if err != nil && ctx.Err() == nil {
			m.cfg.Logger.Warn().Err(err).Msg("slot waker: sweep failed; the next one tries again")
			continue
		}
		so, _ := m.cfg.Locker.Observer().(SlotObserver)
		now := map[string]bool{}
		for _, u := range us {
			if u.Waiting > 0 && u.Limit > 0 {
				sw, err := m.cfg.Locker.WakeSlots(ctx, lease.Limit{Key: u.Key, N: u.Limit}, m.waitHold(), 0)
				if err == nil {
					u.Used, u.Waiting = sw.Used, sw.Waiting
				}
				if sw.Handed > 0 {
					m.cfg.Logger.Warn().Str("limit", u.Key).Int("handed", sw.Handed).
						Msg("slot waker: handed slots that freed by themselves (a run that died) to waiting events")
				}
			}
			if so != nil {
				so.Slots(u.Key, u.Used, u.Limit, u.Waiting)
			}
			now[u.Key] = true
		}
		for k := range seen {
			if !now[k] && so != nil {
				so.Slots(k, 0, 0, 0)
			}
		}
		seen = now
	}
}
