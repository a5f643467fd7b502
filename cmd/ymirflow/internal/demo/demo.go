package demo

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/alicebob/miniredis/v2"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/internal/progress"
	"github.com/ymirflow/ymirflow/cmd/ymirflow/internal/stage"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/fetcher"
	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/metric"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
	"github.com/ymirflow/ymirflow/runners"
	"github.com/ymirflow/ymirflow/runners/demorunner"
	"github.com/ymirflow/ymirflow/webhook"
)

// Defaults of Options.
const (
	DefaultIssues        = 40
	DefaultAgentDuration = 400 * time.Millisecond
	DefaultMaxRetries    = 3
	DefaultTimeout       = 2 * time.Minute
	// WorkersPerStage is how many workers (routers, each with its own consumer name and
	// lease owner) read each stage's streams.
	WorkersPerStage = 2
)

// ErrInterrupted is returned by Run when its context ended before the demo did. The
// routers are closed and the Summary covers what happened until then.
var ErrInterrupted = errors.New("demo interrupted")

// Options configure Run. The zero value is a demo of DefaultIssues issues on an embedded
// Redis that prints nothing.
type Options struct {
	// RedisURL is a real Redis to run on; empty: an embedded one (miniredis) in this
	// process.
	RedisURL string
	// Namespace prefixes every stream and key. Empty: event.DefaultNamespace on the
	// embedded Redis, a fresh "ymir-demo-<random>" on a real one. A namespace given for a
	// real Redis must hold no key yet.
	Namespace string
	// Issues is the number of sample issues in the fake Jira (default DefaultIssues).
	Issues int
	// Seed deals the scenarios out to the issue keys and draws the runs' durations and
	// the scenarios beyond the catalogue.
	Seed int64
	// AgentDuration is the typical length of a simulated agent run: each takes 0.5 to 1.5
	// times it. Negative: instant. Zero: DefaultAgentDuration.
	AgentDuration time.Duration
	// MaxRetries is the attempts per event before the dead-letter stream (default 3).
	MaxRetries int
	// Keep leaves the namespace in a real Redis after the demo (default: deleted), or
	// keeps the embedded Redis serving until ctx ends, for the inspection commands.
	Keep bool
	// Timeout bounds the wait for the pipeline to drain (default DefaultTimeout).
	Timeout time.Duration
	// Out receives the summary: a text report, or JSON with JSON set. Nil: nothing.
	Out  io.Writer
	JSON bool
	// Progress receives the progress while the demo runs: live counters redrawn in place
	// when Live is set (a terminal), else a plain line every ProgressEvery. Nil: nothing.
	Progress      io.Writer
	Live          bool
	ProgressEvery time.Duration
	// Logger receives the pipeline's logs (every component's).
	Logger zerolog.Logger
	// LogFile names where Logger writes, for the summary ("" when unknown).
	LogFile string
	// OnPhase is called as the demo enters each phase (PhaseSweep, PhaseWorkers, ...),
	// with the summary so far. At PhaseDone the summary is complete and the Redis (URL
	// and namespace in the summary) still holds the demo's streams.
	OnPhase func(phase string, s *Summary)
}

// Phases, as OnPhase and the progress name them.
const (
	PhaseStart   = "starting"
	PhaseSweep   = "first sweep"
	PhaseDupes   = "duplicates"
	PhaseWorkers = "workers running"
	PhaseSweep2  = "second sweep"
	PhaseStop    = "stopping"
	PhaseDone    = "done"
)

func (o *Options) defaults() {
	if o.Issues <= 0 {
		o.Issues = DefaultIssues
	}
	switch {
	case o.AgentDuration == 0:
		o.AgentDuration = DefaultAgentDuration
	case o.AgentDuration < 0:
		o.AgentDuration = 0
	}
	o.AgentDuration = o.AgentDuration.Round(time.Millisecond)
	if o.MaxRetries <= 0 {
		o.MaxRetries = DefaultMaxRetries
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.ProgressEvery <= 0 {
		o.ProgressEvery = time.Second
	}
}

// run is one demo.
type run struct {
	o         Options
	start     time.Time
	log       zerolog.Logger
	embedded  *miniredis.Miniredis
	redisURL  string // as given or the embedded one's (no password)
	rdb       redis.UniversalClient
	opts      *redis.UniversalOptions
	topo      event.Topology
	scenarios []Scenario
	plans     map[string]Scenario
	jiraSrv   *fakejira.Server
	jiraHTTP  *http.Transport
	jc        *jira.Client
	fetch     *fetcher.Fetcher
	hc        *handlerCounts
	tally     *progress.Tally
	disp      *display
	sum       *Summary

	stopWorkers context.CancelFunc
	workers     sync.WaitGroup
	routers     []*pipeline.Router

	// The webhook receiver a maintainer's comment reaches the running agent through.
	hook        *webhook.Receiver
	hookMetrics *webhook.Metrics
	hookSecret  []byte
	own         jira.User // ymirflow's Jira account
	commented   sync.WaitGroup
	heardMu     sync.Mutex
	heard       map[string]string // issue -> the follow-up's body as its agent read it
}

// Run runs the demo: a fake Jira seeded with the scenarios, one fetcher sweep, the
// deliberate duplicates, WorkersPerStage workers per stage until every published event
// has its outcome, a second sweep that finds nothing new, and the summary. It returns
// the Summary, and ErrInterrupted when ctx ended first (the routers are closed either
// way). Everything it started is stopped when it returns, except the embedded Redis with
// Keep, which serves until ctx ends.
func Run(ctx context.Context, o Options) (*Summary, error) {
	o.defaults()
	r := &run{o: o, start: time.Now(), log: o.Logger, hc: newHandlerCounts()}
	r.disp = newDisplay(o.Progress, o.Live)
	r.sum = &Summary{Issues: o.Issues, Seed: o.Seed, AgentDuration: o.AgentDuration.String(),
		MaxRetries: o.MaxRetries, Workers: WorkersPerStage, LogFile: o.LogFile}
	defer r.close()
	err := r.main(ctx)
	r.stop() // done already unless main stopped early
	r.sum.Took = time.Since(r.start).Round(10 * time.Millisecond).String()
	if errors.Is(err, ErrInterrupted) {
		r.sum.Interrupted = true
	}
	if r.tally != nil && r.sum.Stages == nil {
		r.collect(context.WithoutCancel(ctx))
	}
	r.disp.clear()
	if err != nil && !errors.Is(err, ErrInterrupted) {
		return r.sum, err
	}
	r.report(err)
	if err == nil && o.Keep && r.embedded != nil {
		r.disp.linef("The embedded Redis keeps serving at %s until Ctrl-C.", r.redisURL)
		<-ctx.Done()
	}
	return r.sum, err
}

func (r *run) phase(p string) {
	r.sum.Phase = p
	r.disp.phase = p
	if r.o.OnPhase != nil {
		r.o.OnPhase(p, r.sum)
	}
}

func (r *run) main(ctx context.Context) error {
	r.phase(PhaseStart)
	if err := r.connect(ctx); err != nil {
		return err
	}
	r.scenarios = Scenarios(r.o.Issues, r.o.Seed)
	r.plans = map[string]Scenario{}
	var issues []fakejira.Issue
	for _, s := range r.scenarios {
		r.plans[s.Key] = s
		issues = append(issues, s.Issue(r.o.Seed))
	}
	r.jiraSrv = fakejira.New(fakejira.Options{Issues: issues, Groups: fakejira.SampleGroups()})
	jiraURL, err := r.jiraSrv.Listen("127.0.0.1:0")
	if err != nil {
		return err
	}
	r.jiraHTTP = &http.Transport{MaxIdleConnsPerHost: 64}
	r.jc, err = jira.New(jira.Options{BaseURL: jiraURL, API: "server", Token: "demo", RateLimit: -1, Timeout: 10 * time.Second,
		RetryBaseDelay: 50 * time.Millisecond, HTTPClient: &http.Client{Transport: r.jiraHTTP}, Logger: r.log})
	if err != nil {
		return err
	}
	r.fetch, err = fetcher.New(fetcher.Config{Jira: r.jc, Redis: r.rdb, Topology: r.topo, MaxLen: event.DefaultMaxLen,
		JQL: "project = RHEL AND assignee = jotnar-project", TriggerGroup: fakejira.SampleTriggerGroup, Logger: r.log})
	if err != nil {
		return err
	}
	if err := r.startWebhook(ctx); err != nil {
		return err
	}
	r.tally = progress.NewTally(r.rdb, r.topo)
	where := "embedded Redis (miniredis) at " + strings.TrimPrefix(r.redisURL, "redis://")
	if r.embedded == nil {
		where = "Redis " + redact.URL(r.redisURL) + ", namespace " + r.topo.Namespace
	}
	r.disp.linef("ymirflow demo: %d issues in a fake Jira, agents of ~%s, %s", r.o.Issues, r.o.AgentDuration, where)

	r.phase(PhaseSweep)
	s1, err := r.fetch.Sweep(ctx)
	if err != nil {
		return r.interrupted(ctx, fmt.Errorf("first sweep: %w", err))
	}
	r.sum.Sweeps = append(r.sum.Sweeps, sweepOf(s1))
	r.disp.linef("sweep 1: %s", s1)

	r.phase(PhaseDupes)
	if err := r.duplicates(ctx, s1); err != nil {
		return r.interrupted(ctx, err)
	}
	d := r.sum.Duplicates
	r.disp.linef("published on purpose: %d triage requests a second time, %d downstream requests enqueued twice by hand",
		d.Triage, d.Enqueued)

	r.phase(PhaseWorkers)
	if err := r.startWorkers(ctx); err != nil {
		return r.interrupted(ctx, err)
	}
	r.disp.linef("%d workers: %d per stage (triage, rebase, backport, rebuild × c9s, c10s), each its own consumer and lease owner",
		len(r.routers), WorkersPerStage)
	if err := r.wait(ctx); err != nil {
		return r.interrupted(ctx, err)
	}

	r.phase(PhaseSweep2)
	s2, err := r.fetch.Sweep(ctx)
	if err != nil {
		return r.interrupted(ctx, fmt.Errorf("second sweep: %w", err))
	}
	r.sum.Sweeps = append(r.sum.Sweeps, sweepOf(s2))
	r.disp.clear()
	note := "nothing new"
	if s2.Published > 0 {
		note = "unexpected: it published again"
	}
	r.disp.linef("sweep 2: %s: %s", s2, note)

	r.phase(PhaseStop)
	r.stop()
	r.collect(ctx)
	r.phase(PhaseDone)
	return nil
}

// interrupted turns an error caused by ctx's end into ErrInterrupted.
func (r *run) interrupted(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%s)", ErrInterrupted, r.sum.Phase)
	}
	return err
}

// connect opens the embedded or the real Redis and picks the namespace.
func (r *run) connect(ctx context.Context) error {
	ns := r.o.Namespace
	if r.o.RedisURL == "" {
		m := miniredis.NewMiniRedis()
		// miniredis leaves TTLs alone unless told to: without this, a lease whose holder
		// died would never expire.
		m.ClockTTL(true)
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			return fmt.Errorf("start the embedded Redis: %w", err)
		}
		r.embedded = m
		r.redisURL = "redis://" + m.Addr() + "/0"
		if ns == "" {
			ns = event.DefaultNamespace
		}
	} else {
		r.redisURL = r.o.RedisURL
	}
	opts, err := pipeline.ClientOptions(r.redisURL)
	if err != nil {
		return err
	}
	r.opts = opts
	rdb, err := pipeline.Connect(ctx, r.redisURL)
	if err != nil {
		return err
	}
	r.rdb = rdb
	if r.embedded == nil {
		if ns == "" {
			ns = "ymir-demo-" + randomHex(4)
		} else if n, err := r.namespaceKeys(ctx, ns, 1); err != nil {
			return err
		} else if len(n) > 0 {
			return fmt.Errorf("namespace %q already holds keys (e.g. %s): the demo needs a fresh one; leave YMIR_NAMESPACE unset for a random one", ns, n[0])
		}
	}
	r.topo = event.Topology{Namespace: ns}
	r.sum.Namespace = ns
	r.sum.Redis = redact.URL(r.redisURL)
	r.sum.Embedded = r.embedded != nil
	return nil
}

// namespaceKeys returns up to limit keys (0: all) of namespace ns: every key containing
// "<ns>:" (streams, markers, and the leases of a non-default namespace) plus the lease
// keys of the demo's issues (a default namespace's leases are not prefixed).
func (r *run) namespaceKeys(ctx context.Context, ns string, limit int) ([]string, error) {
	var out []string
	iter := r.rdb.Scan(ctx, 0, "*"+ns+":*", 1000).Iterator()
	for iter.Next(ctx) {
		out = append(out, iter.Val())
		if limit > 0 && len(out) >= limit {
			return out, nil
		}
	}
	if err := iter.Err(); err != nil {
		return nil, fmt.Errorf("look for keys of namespace %s: %w", ns, err)
	}
	if (event.Topology{Namespace: ns}).LockScope() != "" {
		return out, nil
	}
	locker, err := lease.New(r.rdb, lease.Options{})
	if err != nil {
		return nil, err
	}
	var cand []string
	for _, s := range Scenarios(r.o.Issues, r.o.Seed) {
		for _, a := range event.Agents {
			k := locker.Keys(a, s.Key)
			cand = append(cand, k.Lock, k.Info, k.Fence, k.Queue, k.Done)
		}
	}
	for i := 0; i < len(cand); i += 500 {
		n, err := r.rdb.Exists(ctx, cand[i:min(i+500, len(cand))]...).Result()
		if err != nil {
			return nil, err
		}
		if n == 0 {
			continue
		}
		for _, k := range cand[i:min(i+500, len(cand))] {
			if r.rdb.Exists(ctx, k).Val() > 0 {
				out = append(out, k)
			}
		}
	}
	return out, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// duplicates publishes the deliberate duplicates: the fetcher's triage request of each
// Duplicate scenario appended again as it was (a producer that retried its XADD), and
// each Enqueue scenario's downstream request enqueued twice by hand. They go in before
// any worker starts, so whichever copy runs second finds the issue locked, or released
// after it entered its stream: the lock drops it either way.
func (r *run) duplicates(ctx context.Context, s1 fetcher.Summary) error {
	pub := event.NewPublisher(r.rdb, event.DefaultMaxLen)
	for _, s := range r.scenarios {
		switch {
		case s.Duplicate:
			o, ok := s1.Outcome(s.Key)
			if !ok || !o.Published {
				continue
			}
			xs, err := r.rdb.XRangeN(ctx, o.Stream, o.EntryID, o.EntryID, 1).Result()
			if err != nil {
				return fmt.Errorf("read %s %s to publish it again: %w", o.Stream, o.EntryID, err)
			}
			if len(xs) == 0 {
				return fmt.Errorf("read %s %s to publish it again: the entry is gone", o.Stream, o.EntryID)
			}
			if err := r.rdb.XAdd(ctx, &redis.XAddArgs{Stream: o.Stream, Values: xs[0].Values}).Err(); err != nil {
				return fmt.Errorf("publish %s again: %w", s.Key, err)
			}
			r.sum.Duplicates.Triage++
			r.sum.Duplicates.Keys = append(r.sum.Duplicates.Keys, s.Key)
		case s.Enqueue != "":
			agent, branch, _ := strings.Cut(s.Enqueue, ":")
			stream := r.topo.Stream(agent, branch, false)
			for range 2 {
				task := event.Task{}
				for k, v := range map[string]any{
					"jira_issue":    s.Key,
					"target_branch": branch,
					"triage_result": map[string]any{"resolution": agent, "data": map[string]any{"jira_issue": s.Key}},
				} {
					if err := task.Set(k, v); err != nil {
						return err
					}
				}
				msg, err := event.New(event.RequestedEvent(agent), s.Key, task, nil)
				if err != nil {
					return err
				}
				if _, err := pub.PublishID(ctx, stream, msg); err != nil {
					return err
				}
			}
			r.sum.Duplicates.Enqueued++
			r.sum.Duplicates.Keys = append(r.sum.Duplicates.Keys, s.Key)
		}
	}
	sort.Strings(r.sum.Duplicates.Keys)
	// The lock tells a duplicate that waited from a later event by the millisecond of
	// its stream id: let the clock move on before any run can end.
	time.Sleep(2 * time.Millisecond)
	return nil
}

// Timing of the workers, scaled to the agents' runs.
func (r *run) timing() (lockTTL, retryInitial time.Duration) {
	d := r.o.AgentDuration
	lockTTL = max(3*time.Second, 6*d)
	// The waits between attempts come out at 2 and 16 times RetryInitial, not 1 and 2:
	// watermill's middleware.Retry advances its backoff in ShouldRetry's Delay and in
	// OnRetryHook as well as before waiting. Aim at about d/4 and 2d.
	retryInitial = min(max(d/8, 5*time.Millisecond), time.Second)
	return lockTTL, retryInitial
}

// startWorkers starts WorkersPerStage routers per stage, as that many `ymirflow worker`
// processes would run, and waits until they all read.
func (r *run) startWorkers(ctx context.Context) error {
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.stopWorkers = cancel
	lockTTL, retryInitial := r.timing()
	runner := planRunner{base: demorunner.Runner{Duration: r.o.AgentDuration, Seed: r.o.Seed}, plans: r.plans,
		commenting: func(issue string) { r.comment(wctx, issue) }, heard: r.hear}
	// On triage, the stage the demo's comment reaches, a maintainer's comment
	// (comment.created) that meets a running holder goes to its mailbox; any other busy
	// event is dropped, as the duplicates must be. The other stages only drop: a
	// deliver rule costs a router its leases taken ahead (lockmw), and no comment
	// reaches them in the demo.
	triagePolicies := lockmw.Policies{Default: lockmw.Rule{Policy: lockmw.Drop},
		ByType: map[string]lockmw.Rule{event.CommentCreated: {Policy: lockmw.Deliver}}}
	// Claims never happen in a demo that drains in time: MaxIdleTime outlasts it. (On
	// miniredis they would be unsafe: its XCLAIM ignores min-idle-time.)
	maxIdle := max(r.o.Timeout+time.Minute, 3*lockTTL)
	r.workers.Add(1)
	go func() {
		defer r.workers.Done()
		_ = r.hook.Run(wctx)
	}()
	for _, st := range progress.Stages(r.topo) {
		for i := 1; i <= WorkersPerStage; i++ {
			consumer := fmt.Sprintf("%s-%d", st.Name, i)
			log := r.log.With().Str("worker", consumer).Logger()
			locker, err := lease.New(r.rdb, lease.Options{TTL: lockTTL, Owner: consumer, Scope: r.topo.LockScope(), Logger: log})
			if err != nil {
				return err
			}
			policies := lockmw.Policies{Default: lockmw.Rule{Policy: lockmw.Drop}}
			if st.Agent == "triage" {
				policies = triagePolicies
			}
			name := st.Name
			router, err := stage.New(stage.Config{
				Router: pipeline.RouterConfig{Client: r.rdb, ClientOptions: r.opts, Topology: r.topo,
					Agent: st.Agent, Branch: st.Branch, Consumer: consumer, Concurrency: 1,
					BlockTime: 300 * time.Millisecond, MaxIdleTime: maxIdle, ClaimInterval: time.Second,
					NackResendSleep: 100 * time.Millisecond, MaxRetries: r.o.MaxRetries, RetryInitial: retryInitial,
					CloseTimeout: 10 * time.Second, MaxLen: event.DefaultMaxLen, Policies: policies, Locker: locker,
					Logger: log, Pauses: locker.Pauses()},
				Handler: handlers.Config{Runner: runner, Jira: r.jc,
					Publisher: event.NewPublisher(r.rdb, event.DefaultMaxLen),
					Results:   event.NewResults(r.rdb, r.topo.Results(), event.DefaultMaxLen)},
				Wrap: func(h message.NoPublishHandlerFunc) message.NoPublishHandlerFunc { return r.hc.wrap(name, h) },
			})
			if err != nil {
				return err
			}
			r.routers = append(r.routers, router)
			r.workers.Add(1)
			go func() {
				defer r.workers.Done()
				if err := router.Run(wctx); err != nil && wctx.Err() == nil {
					r.log.Error().Err(err).Str("worker", consumer).Msg("router stopped")
				}
			}()
		}
	}
	for _, router := range r.routers {
		select {
		case <-router.Running():
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Second):
			return errors.New("a worker did not start within 10s")
		}
	}
	return nil
}

// wait watches the streams until every published event has its outcome.
func (r *run) wait(ctx context.Context) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(r.o.Timeout)
	defer deadline.Stop()
	for {
		snap, err := r.tally.Take(ctx, r.hc.fill)
		if err != nil {
			return err
		}
		done := snap.Drained() && snap.Total.Published > 0
		// The last snapshot is shown whatever the time since the one before: the last
		// progress line agrees with the summary.
		r.disp.update(time.Since(r.start), snap, done)
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("the pipeline did not drain within %s: %d of %d events have an outcome, %d pending",
				r.o.Timeout, snap.Total.Outcomes, snap.Total.Published, snap.Total.Pending)
		case <-tick.C:
		}
	}
}

// startWebhook starts the webhook receiver, classifying what it stores until the workers
// stop: the way a maintainer's comment in Jira reaches a running agent.
func (r *run) startWebhook(ctx context.Context) error {
	me, err := r.jc.Myself(ctx)
	if err != nil {
		return fmt.Errorf("the fake Jira's own account: %w", err)
	}
	r.own = me
	r.hookSecret = []byte(randomHex(16))
	r.hookMetrics = webhook.NewMetrics(metric.NewRegistry())
	r.heard = map[string]string{}
	r.hook, err = webhook.New(webhook.Config{Fetcher: r.fetch, Jira: r.jc, Redis: r.rdb, Topology: r.topo,
		Secret: r.hookSecret, OwnAccounts: []string{me.AccountID, me.Name}, Metrics: r.hookMetrics,
		Deadline: 10 * time.Second, Logger: r.log})
	return err
}

// comment has a maintainer, and then ymirflow's own account, comment on issue in the
// fake Jira, and delivers both to the webhook receiver as Jira would (signed
// comment_created, own account first: the receiver classifies in order). It does not
// wait for them: the run of issue waits for its follow-up.
func (r *run) comment(ctx context.Context, issue string) {
	r.commented.Add(1)
	go func() {
		defer r.commented.Done()
		for _, c := range []struct {
			by   jira.User
			text string
		}{
			{r.own, "ymirflow: triage started (ymirflow's own comment: never handed to an agent)"},
			{fakejira.SampleMaintainer, "Please also check the tests of the 3.2 branch. My token ghp_Demo0123456789abcdefghijklmnop must not reach the agent."},
		} {
			cm, ok := r.jiraSrv.AddComment(issue, c.by, c.text)
			if !ok {
				r.log.Error().Str("issue_key", issue).Msg("demo: no such issue to comment on")
				return
			}
			body, _ := json.Marshal(map[string]any{"timestamp": time.Now().UnixMilli(), "webhookEvent": webhook.EventCommentCreated,
				"comment": map[string]any{"id": cm.ID, "author": c.by, "body": c.text}, "issue": map[string]any{"key": issue}})
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "/", bytes.NewReader(body))
			if err != nil {
				return
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(webhook.HeaderSignature, webhook.Sign(r.hookSecret, body))
			req.Header.Set(webhook.HeaderDelivery, "demo-comment-"+cm.ID)
			rec := httptest.NewRecorder()
			r.hook.ServeHTTP(rec, req)
			if rec.Code != http.StatusAccepted {
				r.log.Error().Int("status", rec.Code).Str("answer", rec.Body.String()).Str("issue_key", issue).Msg("demo: comment not accepted by the webhook")
			}
		}
	}()
}

// hear notes the follow-up a run read (its body, as the agent got it).
func (r *run) hear(issue string, f runners.Followup) {
	r.heardMu.Lock()
	defer r.heardMu.Unlock()
	r.heard[issue] = f.Fields["body"]
}

// stop closes the routers: they stop reading, cancel their handlers (whose leases are
// released and entries left pending) and return.
func (r *run) stop() {
	if r.stopWorkers == nil {
		return
	}
	r.stopWorkers()
	done := make(chan struct{})
	go func() { r.workers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		r.log.Error().Msg("routers did not stop within 30s")
	}
	// No handler runs now, so no run asks for a comment any more.
	r.commented.Wait()
	for _, router := range r.routers {
		_ = router.Close()
	}
	r.stopWorkers = nil
	if r.jiraHTTP != nil {
		r.jiraHTTP.CloseIdleConnections()
	}
	// A closed watermill-redisstream subscriber does not wait for its reader goroutine,
	// which ends after its XREADGROUP returns, a 500ms pause and a "read fail" log line.
	// Wait for them (and for the Jira connections' goroutines), so that nothing the
	// workers started outlives Run.
	deadline := time.Now().Add(3 * time.Second)
	for subscriberReaders() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
}

// subscriberReaders reports whether a watermill-redisstream subscriber goroutine is
// still alive in this process.
func subscriberReaders() bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Contains(buf[:n], []byte("redisstream.(*Subscriber)"))
		}
		buf = make([]byte, 2*len(buf))
	}
}

// close stops everything the demo started, and deletes its namespace in a real Redis
// unless Keep.
func (r *run) close() {
	r.stop()
	if r.jiraSrv != nil {
		r.jiraSrv.Close()
	}
	if r.jiraHTTP != nil {
		r.jiraHTTP.CloseIdleConnections()
	}
	if r.rdb != nil {
		if r.embedded == nil && !r.o.Keep && r.sum.Namespace != "" {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			keys, err := r.namespaceKeys(ctx, r.sum.Namespace, 0)
			for len(keys) > 0 && err == nil {
				n := min(len(keys), 500)
				err = r.rdb.Del(ctx, keys[:n]...).Err()
				keys = keys[n:]
			}
			cancel()
			if err != nil {
				r.log.Warn().Err(err).Str("namespace", r.sum.Namespace).Msg("could not delete the demo's namespace")
			}
		}
		_ = r.rdb.Close()
	}
	if r.embedded != nil {
		r.embedded.Close()
	}
}

// collect fills the summary from the streams, the handlers' counts and the fake Jira.
func (r *run) collect(ctx context.Context) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	snap, err := r.tally.Take(cctx, r.hc.fill)
	if err != nil {
		r.sum.Error = err.Error()
		return
	}
	r.sum.Stages = snap.Stages
	for i := range r.sum.Stages {
		r.sum.Stages[i].Running = 0
	}
	r.sum.Total = snap.Total
	r.sum.Total.Running = 0
	r.sum.DropReasons = r.tally.DropReasons
	r.sum.Repeats = r.tally.Repeats
	r.sum.OwnComments = int(r.hookMetrics.Count(http.StatusAccepted, "own_account"))
	r.sum.Followups = nil
	for _, sc := range r.scenarios {
		if !sc.Comment || !sc.Published() {
			continue
		}
		f := FollowupResult{Key: sc.Key, Stage: "triage"}
		for _, got := range r.tally.Followups {
			if got.Key == sc.Key {
				f = FollowupResult{Key: got.Key, Stage: got.Stage, Fate: got.Fate, CommentID: got.CommentID, Author: got.Author}
			}
		}
		r.heardMu.Lock()
		f.Body = r.heard[sc.Key]
		r.heardMu.Unlock()
		r.sum.Followups = append(r.sum.Followups, f)
	}
	for _, st := range snap.Stages {
		if st.Outcomes < st.Published {
			r.sum.Unaccounted += st.Published - st.Outcomes
		}
	}
	if r.jiraSrv == nil {
		return
	}
	for _, s := range r.scenarios {
		got := slices.Clone(r.jiraSrv.Labels(s.Key))
		if got == nil {
			got = []string{}
		}
		slices.Sort(got)
		want := s.ExpectedLabels(r.o.MaxRetries)
		res := IssueResult{Key: s.Key, Path: s.Path(r.o.MaxRetries), Labels: got, Expected: want}
		res.AsPlanned = slices.Equal(got, want)
		if res.AsPlanned {
			r.sum.AsPlanned++
		}
		r.sum.IssueResults = append(r.sum.IssueResults, res)
	}
}

func sweepOf(s fetcher.Summary) SweepSummary {
	out := SweepSummary{Found: s.Found, Published: s.Published, Skipped: map[string]int{}, Text: s.String()}
	for k, v := range s.Skipped {
		if v > 0 {
			out.Skipped[string(k)] = v
		}
	}
	return out
}

// report writes the summary to Out: JSON, or the text report after a closing line.
func (r *run) report(err error) {
	if errors.Is(err, ErrInterrupted) {
		r.disp.linef("Interrupted after %s (%s): workers stopped, in-flight runs cancelled, their leases released.",
			r.sum.Took, r.sum.Phase)
	}
	if r.o.Out == nil {
		return
	}
	if r.o.JSON {
		_ = r.sum.WriteJSON(r.o.Out)
		return
	}
	if err == nil {
		fmt.Fprintf(r.o.Out, "Done in %s: %d events published, %d run, %d dropped by the lock, %d delivered to a running agent, %d retries, %d dead.\n",
			r.sum.Took, r.sum.Total.Published, r.sum.Total.Run, r.sum.Total.Dropped, r.sum.Total.Delivered, r.sum.Total.Retried, r.sum.Total.Dead)
	}
	if r.sum.Stages == nil {
		return
	}
	r.sum.WriteText(r.o.Out, r.o.Keep)
}
