// Package stage builds one stage of the pipeline, as `ymirflow worker` (and so `ymirflow
// dev`, which runs workers) and the demo run it: the agent's handler (handlers.New) on a
// router (pipeline.NewRouter: the stage's subscriptions, read through the lock middleware
// lockmw with the caller's lease.Locker). The wiring between the two is written here
// once: the handler's stage, topology, logger, retries and mailbox follow the router's.
package stage

import (
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/pipeline"
)

// Config is one stage: how it reads (Router) and what it runs (Handler).
type Config struct {
	// Router is how the stage reads: every field but Handler and OnDead, which New
	// sets. Its Locker is the caller's, built with the process's key layout.
	Router pipeline.RouterConfig
	// Handler is what the stage runs: the runner, Jira, the publisher and results
	// stream. New sets its Agent, Branch, Topology, Logger, MaxRetries, Mailbox and
	// MailboxDepth from Router, so the two never disagree.
	Handler handlers.Config
	// Wrap, when set, wraps the agent's handler (the demo counts what each stage
	// handles). Nil: the handler as handlers.New returns it.
	Wrap func(message.NoPublishHandlerFunc) message.NoPublishHandlerFunc
	// NoticeFailures comments on the Jira issue of every event dead-lettered after the
	// handler failed (handlers.FailureNotice).
	NoticeFailures bool
}

// New returns the stage's router, not yet running (pipeline.Router.Run runs it).
func New(c Config) (*pipeline.Router, error) {
	rc, hc := c.Router, c.Handler
	hc.Agent, hc.Branch, hc.Topology = rc.Agent, rc.Branch, rc.Topology
	hc.Logger, hc.MaxRetries = rc.Logger, rc.MaxRetries
	// A run has a mailbox where a busy event can be delivered to it.
	hc.Mailbox, hc.MailboxDepth = rc.Policies.Uses(lockmw.Deliver), rc.MailboxDepth
	h, err := handlers.New(hc)
	if err != nil {
		return nil, err
	}
	if c.Wrap != nil {
		h = c.Wrap(h)
	}
	rc.Handler = h
	if c.NoticeFailures {
		rc.OnDead = handlers.FailureNotice(hc)
	}
	return pipeline.NewRouter(rc)
}
