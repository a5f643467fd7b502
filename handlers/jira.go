package handlers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// JiraAPI is what the handlers need from Jira; *jira.Client implements it.
type JiraAPI interface {
	GetIssue(ctx context.Context, key string, fields []string) (jira.Issue, error)
	UpdateLabels(ctx context.Context, key string, add, remove []string) error
	AddComment(ctx context.Context, key, body string) error
}

var _ JiraAPI = (*jira.Client)(nil)

func (h *handler) readIssue(ctx context.Context, key string) (labels []string, status string, known bool, err error) {
	if h.cfg.Jira == nil {
		return nil, "", false, nil
	}
	is, err := h.cfg.Jira.GetIssue(ctx, key, []string{"labels", "status"})
	if err != nil {
		return nil, "", false, err
	}
	return is.Fields.Labels, is.Fields.Status.Name, true, nil
}

// setLabels writes a label change made for ev. Under a lease the write is fenced: the
// lease is proven (one GET) right before the request is sent and the write is refused
// with lease.ErrLeaseLost when it is gone. It is proven again after Jira answered: if
// it was lost in between (the process paused between the check and the write), the
// write may have landed on a newer holder's state, so the labels are converged to the
// issue's last recorded outcome before the error is returned.
func (h *handler) setLabels(ctx context.Context, ev *job, add, remove []string) (err error) {
	remove = slices.DeleteFunc(slices.Clone(remove), func(l string) bool { return slices.Contains(add, l) })
	if len(add) == 0 && len(remove) == 0 {
		return nil
	}
	if h.cfg.Jira == nil || h.cfg.DryRun {
		ev.log.Info().Strs("add", add).Strs("remove", remove).Bool("dry_run", true).Msg("jira labels not written (dry run)")
		return nil
	}
	if err := aborted(ctx); err != nil {
		return err
	}
	le, fenced := lockmw.LeaseFrom(ctx)
	ctx, span := h.span(ctx, ev, "jira labels", attribute.Bool("ymirflow.fenced", fenced),
		attribute.StringSlice("ymirflow.labels.add", add), attribute.StringSlice("ymirflow.labels.remove", remove))
	defer func() { h.endSpan(span, err) }()
	if fenced {
		if err := h.fence(ctx, ev, le, "labels"); err != nil {
			return err
		}
	}
	if err := h.cfg.Jira.UpdateLabels(ctx, ev.key, add, remove); err != nil {
		return err
	}
	ev.log.Info().Strs("add", add).Strs("remove", remove).Msg("jira labels written")
	if fenced {
		if a := aborted(ctx); a != nil && !errors.Is(a, lease.ErrLeaseLost) {
			// Shutdown (or the lease could no longer be proven): the lease is still
			// ours until the handler returns, so no newer holder can have written.
			return nil
		}
		if err := le.Check(ctx); errors.Is(err, lease.ErrLeaseLost) {
			h.cfg.Fences.FencedWriteRaced(h.cfg.Agent, "labels")
			ev.log.Warn().Err(err).Strs("add", add).Strs("remove", remove).
				Msg("fenced write raced: the lease was lost while the label write was in flight; converging the labels")
			h.converge(ctx, ev)
			return fmt.Errorf("label write raced the loss of the lease: %w", err)
		}
	}
	return nil
}

// fence proves the lease in one round trip before a write made for ev is sent.
func (h *handler) fence(ctx context.Context, ev *job, le *lease.Lease, target string) error {
	err := le.Check(ctx)
	if errors.Is(err, lease.ErrLeaseLost) {
		trace.SpanFromContext(ctx).SetAttributes(attribute.Bool("ymirflow.refused", true))
		h.cfg.Fences.FencedWriteRefused(h.cfg.Agent, target)
		ev.log.Warn().Err(err).Str("target", target).Msg("fenced write refused")
	}
	return err
}

// comment posts a comment made for ev, fenced like setLabels; comments are best effort.
func (h *handler) comment(ctx context.Context, ev *job, body string) {
	if err := h.postComment(ctx, ev, body); err != nil {
		ev.log.Warn().Err(err).Msg("could not post a jira comment (not critical)")
	}
}

// postComment posts body on ev's issue (fenced under a lease, as comment does) and
// returns why it was not posted; a dry run posts nothing and succeeds.
func (h *handler) postComment(ctx context.Context, ev *job, body string) error {
	body = h.cfg.Redactor.String(body)
	if h.cfg.Jira == nil || h.cfg.DryRun {
		ev.log.Info().Str("comment", body).Bool("dry_run", true).Msg("jira comment not posted (dry run)")
		return nil
	}
	le, fenced := lockmw.LeaseFrom(ctx)
	ctx, span := h.span(ctx, ev, "jira comment", attribute.Bool("ymirflow.fenced", fenced))
	var err error
	defer func() { h.endSpan(span, err) }()
	if fenced {
		if err = h.fence(ctx, ev, le, "comment"); err != nil {
			ev.log.Warn().Err(err).Msg("jira comment not posted: the lease is not proven")
			return err
		}
	}
	err = h.cfg.Jira.AddComment(ctx, ev.key, body)
	return err
}

// commentLister is the optional part of JiraAPI that lists an issue's comments
// (*jira.Client has it): to find a comment posted before, by its marker.
type commentLister interface {
	Comments(ctx context.Context, key string) ([]jira.Comment, error)
}

// commented reports whether one of key's comments contains marker; false when the
// Jira client cannot list comments or the listing failed (logged: the caller posts,
// preferring a duplicate to none).
func (h *handler) commented(ctx context.Context, ev *job, marker string) bool {
	cl, ok := h.cfg.Jira.(commentLister)
	if !ok || h.cfg.DryRun {
		return false
	}
	cs, err := cl.Comments(ctx, ev.key)
	if err != nil {
		ev.log.Warn().Err(err).Msg("could not list the issue's comments; posting without looking for an earlier post")
		return false
	}
	for _, c := range cs {
		if strings.Contains(c.Body, marker) {
			return true
		}
	}
	return false
}
