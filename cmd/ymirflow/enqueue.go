package main

import (
	"context"
	"fmt"
	"io"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

const enqueueHelp = `
Publishes requests by hand, one per KEY, to the input stream of --agent (and
--branch): for triage a Task {"metadata":{"issue":KEY}}, for a downstream agent the
triage state it reads. Every key is checked before anything is published; each is
then published as given, even twice, and its stream id printed.

Arguments:
  KEY...   issue keys, e.g. RHEL-123 (case and surrounding spaces do not matter)
`

// runEnqueue publishes requests by hand: `ymirflow enqueue --agent A
// [--branch B] [--user-triggered] KEY...`. Every key is checked before anything is
// published; each is then published as given, even twice, and its stream id printed.
func runEnqueue(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.Enqueue
	var keys []string
	return operator{name: "enqueue", settings: &cfg, common: &cfg.Common,
		check: func(s *session) (err error) {
			keys, err = enqueueKeys(s.pos)
			return err
		},
		work: func(ctx context.Context, s *session) error { return enqueue(ctx, s, &cfg, keys) },
	}.run(ctx, args, stdout, stderr)
}

// enqueueKeys checks every key given and returns them canonical.
func enqueueKeys(raw []string) ([]string, error) {
	if len(raw) == 0 {
		return nil, usagef("no issue key given: enqueue --agent A [--branch B] [--user-triggered] KEY...")
	}
	keys := make([]string, len(raw))
	for i, k := range raw {
		c, err := lease.Canonicalize(k, lease.DefaultKeyPattern)
		if err != nil {
			return nil, badKey(k)
		}
		keys[i] = c
	}
	return keys, nil
}

// enqueue publishes one request per key, in order, and prints each stream id.
func enqueue(ctx context.Context, s *session, cfg *config.Enqueue, keys []string) error {
	e, stdout := s.env, s.stdout
	tp, stopTracing, err := startTracing(ctx, &cfg.Tracing, "enqueue", e.log)
	if err != nil {
		return err
	}
	defer stopTracing()
	pub := event.NewPublisher(e.rdb, cfg.MaxLen).WithMaxEventBytes(cfg.MaxEventBytes).WithTracerProvider(tp)
	stream := e.topology.Stream(cfg.Agent, cfg.Branch, cfg.UserTriggered)
	for i, key := range keys {
		task, err := requestTask(cfg.Agent, cfg.Branch, key, cfg.UserTriggered)
		if err != nil {
			return err
		}
		msg, err := event.New(event.RequestedEvent(cfg.Agent), key, task, nil)
		if err != nil {
			return err
		}
		id, err := pub.PublishID(ctx, stream, msg)
		if err != nil {
			return fmt.Errorf("%w (%d of %d keys published before it)", err, i, len(keys))
		}
		fmt.Fprintf(stdout, "%s\t%s\t%s\n", id, stream, key)
	}
	return nil
}

// requestTask is the Task of a hand-made request: {"metadata":{"issue":KEY}} for
// triage; for a downstream agent the triage state it reads: jira_issue, target_branch
// and triage_result.{resolution,data.jira_issue}.
func requestTask(agent, branch, key string, userTriggered bool) (event.Task, error) {
	task := event.Task{UserTriggered: userTriggered}
	if agent == "triage" {
		return task, task.Set("issue", key)
	}
	for k, v := range map[string]any{
		"jira_issue":    key,
		"target_branch": branch,
		"triage_result": map[string]any{"resolution": agent, "data": map[string]any{"jira_issue": key}},
	} {
		if err := task.Set(k, v); err != nil {
			return task, err
		}
	}
	return task, nil
}
