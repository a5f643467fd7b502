package fetcher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// Defaults for Config.
const (
	DefaultStaleLabelThreshold = 24 * time.Hour
	DefaultQueuedTTL           = 24 * time.Hour
	DefaultMemberTTL           = time.Minute
)

// triageAgent is the stage the fetcher publishes to.
const triageAgent = "triage"

// Config configures a Fetcher. Jira, Redis and JQL are required.
type Config struct {
	// Jira is the client searches, changelog and group reads and label writes go through.
	Jira *jira.Client
	// Redis is the pipeline's Redis: lease keys, queued markers and the triage streams.
	Redis redis.UniversalClient
	// Topology names the triage streams, the triage group and the namespace of the queued
	// markers.
	Topology event.Topology
	// Locker gives the lease key names and the key canonicalisation. nil: a Locker on Redis
	// with Topology.LockScope(), the workers' default.
	Locker *lease.Locker
	// Stages are the agents whose leases the pre-check looks at; default event.Agents
	// (triage and every downstream agent).
	Stages []string
	// MaxLen is the length the triage streams are trimmed towards after a sweep that
	// published, with event.Trim, which never removes an entry a consumer group still
	// needs. Default: 0, never trim; negative is refused.
	MaxLen int64
	// MaxEventBytes bounds a published request. Default (0): the pipeline's default.
	MaxEventBytes int
	// JQL is the search. Required.
	JQL string
	// TriggerGroup: whoever added ymir_todo last must be in this Jira group. Default
	// (empty): anyone may.
	TriggerGroup string
	// MemberTTL is how long a user found in TriggerGroup stays trusted without asking Jira
	// again, across sweeps and webhook deliveries: a maintainer's next ymir_todo costs no
	// Jira call before its publish. Someone removed from the group can still trigger for
	// this long. Non-members are never remembered beyond one sweep or delivery, so a user
	// just added to the group is not refused. Default (0): DefaultMemberTTL, 1 minute;
	// negative: not remembered beyond one sweep or delivery.
	MemberTTL time.Duration
	// MaxIssues caps the issues published per sweep; issues skipped for any reason do not
	// count. Default: 0, no limit; negative is refused.
	MaxIssues int
	// StaleLabelThreshold: an in-flight label on an issue not updated for this long is
	// recovered. Default (0): DefaultStaleLabelThreshold, 24h; negative is refused.
	StaleLabelThreshold time.Duration
	// QueuedTTL bounds the life of a queued marker (default 24h); it is renewed by every
	// sweep that finds the entry still waiting.
	QueuedTTL time.Duration
	// ComponentField is the field naming the downstream component, checked for modular
	// packages along with the component names. Default DefaultComponentField; "-" for none.
	ComponentField string
	// DryRun: no Jira writes (logged instead); triage requests are still published. A Jira
	// client in dry-run mode implies it. Default: false.
	DryRun bool
	// Logger receives one line per decision (debug for skips) and one per sweep.
	Logger zerolog.Logger
	// Clock is the time source for staleness; default time.Now.
	Clock func() time.Time
	// TracerProvider traces sweeps, webhook batches and each publish, whose span's
	// traceparent goes into the entry (docs/architecture.md, "Tracing"). Nil: no spans.
	TracerProvider trace.TracerProvider
}

// Fetcher sweeps Jira and publishes triage requests. Build it with New. Sweeps may run
// one after another from any goroutine; concurrent sweeps (even from several processes)
// never publish an issue twice, but may repeat each other's Jira writes.
type Fetcher struct {
	jira           *jira.Client
	rdb            redis.UniversalClient
	topo           event.Topology
	locker         *lease.Locker
	stages         []string
	maxLen         int64
	maxEventBytes  int
	jql            string
	triggerGroup   string
	members        *memberCache
	maxIssues      int
	threshold      time.Duration
	queuedTTL      time.Duration
	componentField string
	dryRun         bool
	log            zerolog.Logger
	clock          func() time.Time
	group          string // the triage consumer group
	// cluster: Redis Cluster, where each script touches one slot (markerKey) and the
	// pre-check GETs what it MGETs on one server.
	cluster bool
	tracer  trace.Tracer
}

// New validates cfg and returns a Fetcher. It does no I/O.
func New(cfg Config) (*Fetcher, error) {
	switch {
	case cfg.Jira == nil:
		return nil, errors.New("fetcher: Config.Jira is required")
	case cfg.Redis == nil:
		return nil, errors.New("fetcher: Config.Redis is required")
	case cfg.JQL == "":
		return nil, errors.New("fetcher: JQL is required")
	case cfg.MaxIssues < 0:
		return nil, fmt.Errorf("fetcher: MaxIssues must not be negative, got %d", cfg.MaxIssues)
	case cfg.StaleLabelThreshold < 0:
		return nil, fmt.Errorf("fetcher: StaleLabelThreshold must be positive, got %s", cfg.StaleLabelThreshold)
	case cfg.QueuedTTL < 0:
		return nil, fmt.Errorf("fetcher: QueuedTTL must be positive, got %s", cfg.QueuedTTL)
	case cfg.MaxLen < 0:
		return nil, fmt.Errorf("fetcher: MaxLen must not be negative, got %d", cfg.MaxLen)
	}
	f := &Fetcher{
		jira: cfg.Jira, tracer: event.Tracer(cfg.TracerProvider), rdb: cfg.Redis, topo: cfg.Topology, locker: cfg.Locker,
		stages: cfg.Stages, maxLen: cfg.MaxLen, maxEventBytes: cfg.MaxEventBytes, jql: cfg.JQL, triggerGroup: cfg.TriggerGroup,
		maxIssues: cfg.MaxIssues, threshold: cfg.StaleLabelThreshold, queuedTTL: cfg.QueuedTTL,
		componentField: cfg.ComponentField, dryRun: cfg.DryRun || cfg.Jira.DryRun(),
		log: cfg.Logger.With().Str("component", "fetcher").Logger(), clock: cfg.Clock,
	}
	_, f.cluster = cfg.Redis.(*redis.ClusterClient)
	if f.locker == nil {
		o := lease.Options{Scope: cfg.Topology.LockScope()}
		if f.cluster {
			o.Format = lease.KeysCluster
		}
		l, err := lease.New(cfg.Redis, o)
		if err != nil {
			return nil, fmt.Errorf("fetcher: %w", err)
		}
		f.locker = l
	}
	if len(f.stages) == 0 {
		f.stages = event.Agents
	}
	f.stages = slices.Clone(f.stages)
	if f.threshold == 0 {
		f.threshold = DefaultStaleLabelThreshold
	}
	if f.queuedTTL == 0 {
		f.queuedTTL = DefaultQueuedTTL
	}
	if f.queuedTTL < time.Millisecond {
		return nil, fmt.Errorf("fetcher: queued marker TTL must be at least 1ms, got %s", f.queuedTTL)
	}
	switch f.componentField {
	case "":
		f.componentField = DefaultComponentField
	case "-":
		f.componentField = ""
	}
	if f.clock == nil {
		f.clock = time.Now
	}
	ttl := cfg.MemberTTL
	if ttl == 0 {
		ttl = DefaultMemberTTL
	}
	f.members = &memberCache{ttl: ttl, until: map[string]time.Time{}}
	f.group = f.topo.Group(triageAgent, "")
	return f, nil
}

// groupOf is the consumer group reading stream.
func (f *Fetcher) groupOf(stream string) string {
	if r, ok := f.topo.RouteOf(stream); ok {
		return r.Group
	}
	return f.group
}

func (f *Fetcher) triageStreams() []string {
	return []string{f.topo.Stream(triageAgent, "", false), f.topo.Stream(triageAgent, "", true)}
}

// SearchFields are the only fields the rules read: what an issue handed to Process must
// carry (a webhook's issue carries them all).
func (f *Fetcher) SearchFields() []string {
	fs := []string{"labels", "updated", "status", "components", "fixVersions"}
	if f.componentField != "" {
		fs = append(fs, f.componentField)
	}
	return fs
}

// Acts reports whether Process might act on is (publish it, or write one of its labels),
// judging by the fields is carries, with no I/O. It is false only when is carries its
// labels and updated time and no rule triggers on them: a field it lacks can only
// turn a trigger into a skip (the modular check), never the other way. A source may then
// skip the Jira calls it would make before Process (package webhook's scope search).
func (f *Fetcher) Acts(is jira.Issue) bool {
	for _, n := range []string{"labels", "updated"} {
		if _, ok := is.Fields.Raw[n]; !ok {
			return true
		}
	}
	return classify(is, f.clock(), f.threshold, f.componentField).trigger != triggerNone
}

// ErrRedis marks a Sweep error that Redis caused (the pre-check or a publish failed).
var ErrRedis = errors.New("fetcher: Redis failed")

// redisError wraps a Redis failure so that errors.Is(err, ErrRedis) holds; its message is
// the wrapped one.
type redisError struct{ err error }

func (e redisError) Error() string   { return e.err.Error() }
func (e redisError) Unwrap() []error { return []error{ErrRedis, e.err} }

// Fatal reports whether an error from Sweep needs an operator before any sweep can
// succeed: Jira refused the credentials (401) or the search (403).
func Fatal(err error) bool {
	return errors.Is(err, jira.ErrUnauthorized) || errors.Is(err, jira.ErrForbidden)
}

// candidate is an issue that pass 1 wants to act on.
type candidate struct {
	idx   int // index in Summary.Issues
	issue jira.Issue
	d     decision
	// todoAdder is who added ymir_todo, when the source already knows it.
	todoAdder *jira.User
}

// Item is one issue handed to Process: the issue as Jira describes it (at least the
// fields of SearchFields), and what the source already knows of its history.
type Item struct {
	Issue jira.Issue
	// TodoAddedBy, when not nil, is who added ymir_todo last (a webhook's changelog names
	// the user who just added it); the author check then reads no changelog. nil: the
	// changelog is read from Jira, as in a sweep.
	TodoAddedBy *jira.User
}

// Sweep runs one sweep: search, classify (rules A–D), pre-check leases and queued entries
// for the whole batch, then per issue in Jira's order publish the triage request and only
// then flip its trigger label. It returns what it did, with an error when the search or
// Redis failed or Jira refused the credentials; the Summary then covers the issues handled
// before the failure. Errors on one issue's Jira calls are logged and the issue skipped.
func (f *Fetcher) Sweep(ctx context.Context) (Summary, error) {
	start := time.Now()
	sum := Summary{Skipped: map[Reason]int{}, DryRun: f.dryRun}
	ctx, span := f.startSpan(ctx, "fetch sweep")
	finish := func(err error) (Summary, error) {
		f.endSpan(span, sum, err)
		sum.Took = time.Since(start)
		ev := f.log.Info()
		if err != nil {
			ev = f.log.Error().Err(err)
		}
		ev.EmbedObject(sum).Msg("sweep done")
		return sum, err
	}

	// Collect first, act afterwards: offsets shift when label edits take issues out of
	// the JQL during a Server/DC walk.
	var items []Item
	err := f.jira.SearchAll(ctx, f.jql, f.SearchFields(), 0, func(is jira.Issue) error {
		items = append(items, Item{Issue: is})
		return nil
	})
	if err != nil {
		return finish(fmt.Errorf("search Jira: %w", err))
	}
	err = f.process(ctx, items, &sum)
	return finish(err)
}

// Process classifies and publishes issues that came from elsewhere than the search (a
// Jira webhook) through exactly the passes a sweep runs on its search results:
// classification (rules A–D, modular skip), the one-round-trip lock and queue pre-check
// (a locked issue keeps its trigger label and is not published), the ymir_todo author
// check, the idempotent publish and the label flip. Errors are those of Sweep: ErrRedis
// when Redis failed (nothing was flipped without its publish), a Jira 401 when Jira
// refused the credentials. It logs no summary line of its own.
func (f *Fetcher) Process(ctx context.Context, items ...Item) (Summary, error) {
	start := time.Now()
	sum := Summary{Skipped: map[Reason]int{}, DryRun: f.dryRun}
	ctx, span := f.startSpan(ctx, "fetch process")
	err := f.process(ctx, items, &sum)
	f.endSpan(span, sum, err)
	sum.Took = time.Since(start)
	return sum, err
}

// process runs passes 1–3 on a batch and fills sum.
func (f *Fetcher) process(ctx context.Context, items []Item, sum *Summary) error {
	sum.Found = len(items)

	// Pass 1: classify, no I/O.
	now := f.clock()
	seen := make(map[string]bool, len(items))
	var cands []candidate
	var keys []string
	stale := map[string]bool{}
	for _, it := range items {
		is := it.Issue
		key, err := f.locker.Canonicalize(is.Key)
		o := Outcome{Key: key}
		switch {
		case err != nil:
			o.Key, o.Reason, o.Detail = is.Key, ReasonInvalidKey, err.Error()
		case seen[key]:
			o.Reason, o.Detail = ReasonDuplicate, "the search returned the issue twice"
		default:
			seen[key] = true
			d := classify(is, now, f.threshold, f.componentField)
			o.Trigger, o.Reason, o.Detail = d.trigger, d.skip, d.why
			if d.trigger != triggerNone {
				is.Key = key
				cands = append(cands, candidate{idx: len(sum.Issues), issue: is, d: d, todoAdder: it.TodoAddedBy})
				keys = append(keys, key)
				if d.trigger == TriggerStale {
					stale[key] = true
				}
			}
		}
		sum.Issues = append(sum.Issues, o)
	}

	// Pass 2: one pipelined round trip for the whole batch.
	pre, err := f.precheck(ctx, keys, stale)
	if err != nil {
		err = redisError{err}
		for _, c := range cands {
			sum.Issues[c.idx].Reason = ReasonError
			sum.Issues[c.idx].Detail = "not handled: " + err.Error()
		}
		f.count(sum)
		return err
	}

	// Pass 3: act, in Jira's order. A cancelled ctx (SIGTERM) stops the sweep between
	// issues: the issue at hand is finished (published and flipped, or neither) with a
	// context that is not cancelled, the rest stay as they are for the next sweep.
	members := map[string]bool{}
	work := context.WithoutCancel(ctx)
	for _, c := range cands {
		o := &sum.Issues[c.idx]
		err := ctx.Err()
		if err != nil {
			err = fmt.Errorf("%w: the sweep stopped before %s", context.Cause(ctx), c.issue.Key)
		} else {
			err = f.handle(work, c, o, pre, members, sum)
		}
		if err != nil {
			for _, rest := range cands {
				if rest.idx > c.idx {
					sum.Issues[rest.idx].Reason = ReasonError
					sum.Issues[rest.idx].Detail = "not handled: the sweep stopped early"
				}
			}
			if ctx.Err() != nil && o.Reason == "" && !o.Published {
				o.Detail = "not handled: the sweep stopped early"
			}
			if !o.Published && o.Reason == "" {
				o.Reason = ReasonError
			}
			f.count(sum)
			return err
		}
	}
	f.count(sum)
	f.trim(ctx, sum)
	return nil
}

// trim keeps the triage streams that this sweep appended to near MaxLen (best effort: a
// failure is logged and the next sweep tries again).
func (f *Fetcher) trim(ctx context.Context, sum *Summary) {
	if f.maxLen <= 0 || sum.Published == 0 {
		return
	}
	done := map[string]bool{}
	for _, o := range sum.Issues {
		if !o.Published || done[o.Stream] {
			continue
		}
		done[o.Stream] = true
		if n, err := event.Trim(ctx, f.rdb, o.Stream, f.maxLen); err != nil {
			f.log.Warn().Err(err).Str("stream", o.Stream).Msg("trim failed; the next sweep tries again")
		} else if n > 0 {
			f.log.Debug().Str("stream", o.Stream).Int64("removed", n).Msg("stream trimmed")
		}
	}
}

// count fills Published and Skipped from the outcomes.
func (f *Fetcher) count(sum *Summary) {
	sum.Published = 0
	clear(sum.Skipped)
	for _, o := range sum.Issues {
		if o.Published {
			sum.Published++
		} else if o.Reason != "" {
			sum.Skipped[o.Reason]++
		}
	}
}

// handle acts on one candidate. A returned error ends the sweep (Redis failed, or Jira
// refused the credentials).
func (f *Fetcher) handle(ctx context.Context, c candidate, o *Outcome, pre precheckResult, members map[string]bool, sum *Summary) error {
	key := c.issue.Key
	log := f.log.With().Str("issue_key", key).Str("trigger", string(c.d.trigger)).Logger()

	if stage, ok := pre.locked[key]; ok {
		o.Reason, o.Stage = ReasonLocked, stage
		o.Detail = "a " + stage + " lease is alive: labels left in place, nothing published"
		log.Info().Str("stage", stage).Msg("issue locked: skipped, its labels kept for the sweep after the release")
		return nil
	}
	if id, ok := pre.queued[key]; ok {
		o.Reason, o.EntryID = ReasonQueued, id
		o.Detail = "entry " + id + " still waits in a triage stream"
		log.Debug().Str("entry_id", id).Msg("issue already queued: skipped")
		return nil
	}

	if c.d.trigger == triggerTodoM {
		o.Reason, o.Trigger = ReasonModular, TriggerTodo
		log.Info().Msg("modular package: ymir_todo consumed, not published")
		return f.writeLabels(ctx, log, o, sum, nil, []string{labels.Todo}, false)
	}

	if f.maxIssues > 0 && sum.Published >= f.maxIssues {
		o.Reason, o.Detail = ReasonMaxIssues, fmt.Sprintf("MaxIssues=%d already published", f.maxIssues)
		log.Debug().Msg("MaxIssues reached: skipped")
		return nil
	}

	userTriggered := c.d.trigger == TriggerTodo
	if userTriggered && f.triggerGroup != "" {
		ok, who, err := f.addedByMember(ctx, key, c.todoAdder, members)
		switch {
		case err != nil && errors.Is(err, jira.ErrUnauthorized):
			o.Reason, o.Detail = ReasonError, err.Error()
			return fmt.Errorf("check who added %s to %s: %w", labels.Todo, key, err)
		case err != nil:
			o.Reason, o.Detail = ReasonError, "author check: "+err.Error()
			log.Warn().Err(err).Msg("cannot check who added ymir_todo: skipped, retried next sweep")
			return nil
		case !ok:
			o.Reason = ReasonUntrusted
			o.Detail = fmt.Sprintf("ymir_todo added by %q, not a member of %q: label removed", who, f.triggerGroup)
			log.Info().Str("added_by", who).Str("group", f.triggerGroup).Msg("ymir_todo from a non-member: removed")
			return f.writeLabels(ctx, log, o, sum, nil, []string{labels.Todo}, false)
		}
	}

	// Publish first; flip only once the event is out.
	task := triageTask(key, userTriggered)
	msg, err := event.New(event.TriageRequested, key, task, nil)
	if err != nil {
		return fmt.Errorf("build the triage request for %s: %w", key, err)
	}
	stream := f.topo.Stream(triageAgent, "", userTriggered)
	pctx, pspan := f.startPublish(ctx, stream, msg)
	fields := event.Encode(msg)
	err = event.CheckEvent(fields, f.maxEventBytes)
	var id string
	var fresh bool
	if err == nil {
		id, fresh, err = f.publish(pctx, key, stream, fields)
	}
	f.endPublish(pspan, id, fresh, err)
	if err != nil {
		o.Reason, o.Detail = ReasonError, "publish: "+err.Error()
		return redisError{fmt.Errorf("publish the triage request for %s to %s: %w (no label was changed)", key, stream, err)}
	}
	if !fresh {
		o.Reason, o.EntryID = ReasonQueued, id
		o.Detail = "entry " + id + " still waits in a triage stream (found at publish)"
		log.Debug().Str("entry_id", id).Msg("issue already queued: skipped")
		return nil
	}
	o.Published, o.Stream, o.EntryID, o.Reason = true, stream, id, ""
	sum.Published++
	log.Info().Str("stream", stream).Str("entry_id", id).Bool("user_triggered", userTriggered).
		Str("message_uuid", msg.UUID).Str("correlation_id", msg.Metadata.Get(event.MetaCorrelationID)).
		Msg("triage requested")

	switch c.d.trigger {
	case TriggerTodo:
		return f.writeLabels(ctx, log, o, sum, []string{labels.TriageInProgress}, []string{labels.Todo}, true)
	case TriggerRetry:
		return f.writeLabels(ctx, log, o, sum, []string{labels.TriageInProgress}, []string{labels.RetryNeeded}, true)
	case TriggerStale:
		// Upstream's two steps: the stale label becomes ymir_retry_needed, which becomes
		// ymir_triage_in_progress; both show in the issue's history.
		if err := f.writeLabels(ctx, log, o, sum, []string{labels.RetryNeeded}, []string{c.d.staleLabel}, true); err != nil || o.FlipErr != nil {
			return err
		}
		return f.writeLabels(ctx, log, o, sum, []string{labels.TriageInProgress}, []string{labels.RetryNeeded}, true)
	}
	return nil
}

// writeLabels updates an issue's labels, or logs the update in dry run. afterPublish marks
// a flip that goes with a publish: its failure is counted in FlipFailures. Only a 401 is
// returned (it ends the sweep); other failures are logged and recorded in o.FlipErr.
func (f *Fetcher) writeLabels(ctx context.Context, log zerolog.Logger, o *Outcome, sum *Summary, add, remove []string, afterPublish bool) error {
	if f.dryRun {
		log.Info().Strs("add", add).Strs("remove", remove).Bool("dry_run", true).Msg("dry run: labels not written")
		o.Added, o.Removed = appendNew(o.Added, add...), appendNew(o.Removed, remove...)
		return nil
	}
	err := f.jira.UpdateLabels(ctx, o.Key, add, remove)
	if err != nil {
		o.FlipErr = err
		if afterPublish {
			sum.FlipFailures++
			log.Error().Err(err).Strs("add", add).Strs("remove", remove).Str("entry_id", o.EntryID).
				Msg("label flip failed after the publish: the request is out; the queued marker keeps it from being published again")
		} else {
			log.Warn().Err(err).Strs("remove", remove).Msg("label removal failed; retried next sweep")
		}
		if errors.Is(err, jira.ErrUnauthorized) {
			return fmt.Errorf("update the labels of %s: %w", o.Key, err)
		}
		return nil
	}
	sum.LabelWrites++
	o.Added, o.Removed = appendNew(o.Added, add...), appendNew(o.Removed, remove...)
	return nil
}

func appendNew(dst []string, add ...string) []string {
	for _, a := range add {
		if !slices.Contains(dst, a) {
			dst = append(dst, a)
		}
	}
	return dst
}

// addedByMember reports whether whoever added ymir_todo last (newest add in the paginated
// changelog, or known from the source) is a member of the trigger group, and who it was. No add event, or an author
// Jira does not know (404), is "not a member". Memberships are cached for the sweep, and
// members for MemberTTL (f.members).
func (f *Fetcher) addedByMember(ctx context.Context, key string, known *jira.User, cache map[string]bool) (bool, string, error) {
	var author jira.User
	if known != nil {
		author = *known
	} else {
		a, _, found, err := f.jira.LastLabelAdder(ctx, key, labels.Todo)
		if err != nil {
			if errors.Is(err, jira.ErrNotFound) {
				return false, "", nil
			}
			return false, "", err
		}
		if !found {
			return false, "", nil
		}
		author = a
	}
	who := author.ID()
	if who == "" {
		return false, "", nil
	}
	if m, ok := cache[who]; ok {
		return m, who, nil
	}
	if f.members.has(who, f.clock()) {
		return true, who, nil
	}
	groups, err := f.jira.UserGroups(ctx, who)
	if err != nil {
		if errors.Is(err, jira.ErrNotFound) {
			cache[who] = false
			return false, who, nil
		}
		return false, who, err
	}
	m := slices.Contains(groups, f.triggerGroup)
	cache[who] = m
	if m {
		f.members.add(who, f.clock())
	}
	return m, who, nil
}

// InTriggerGroup reports whether u is a member of Config.TriggerGroup, and who u is, as
// the ymir_todo check judges (members cached for MemberTTL). With no TriggerGroup it is
// false: a source that lets only the group act (a budget approval) lets nobody act.
func (f *Fetcher) InTriggerGroup(ctx context.Context, u jira.User) (bool, string, error) {
	if f.triggerGroup == "" {
		return false, u.ID(), nil
	}
	return f.addedByMember(ctx, "", &u, map[string]bool{})
}

// memberCache remembers the users found in the trigger group, each for ttl, across
// sweeps and deliveries (which may run concurrently).
type memberCache struct {
	mu    sync.Mutex
	ttl   time.Duration
	until map[string]time.Time
}

func (c *memberCache) has(who string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return now.Before(c.until[who])
}

func (c *memberCache) add(who string, now time.Time) {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, t := range c.until { // the group's members: a short list
		if !now.Before(t) {
			delete(c.until, k)
		}
	}
	c.until[who] = now.Add(c.ttl)
}

// triageTask is the Python fetcher's Task.from_issue: a TriageInputSchema dump.
func triageTask(key string, userTriggered bool) event.Task {
	t := event.Task{UserTriggered: userTriggered}
	_ = t.Set("issue", key)
	_ = t.Set("force_cve_triage", false)
	_ = t.Set("is_older_zstream", false)
	_ = t.Set("needs_internal_fix", false)
	_ = t.Set("internal_target_branch", nil)
	return t
}
