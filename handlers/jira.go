package handlers

import (
	"context"
	"slices"

	"github.com/ymirflow/ymirflow/internal/jira"
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

func (h *handler) setLabels(ctx context.Context, ev *event, add, remove []string) error {
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
	if err := h.cfg.Jira.UpdateLabels(ctx, ev.key, add, remove); err != nil {
		return err
	}
	ev.log.Info().Strs("add", add).Strs("remove", remove).Msg("jira labels written")
	return nil
}

// comment posts a comment; comments are best effort.
func (h *handler) comment(ctx context.Context, ev *event, body string) {
	body = h.cfg.Redactor.String(body)
	if h.cfg.Jira == nil || h.cfg.DryRun {
		ev.log.Info().Str("comment", body).Bool("dry_run", true).Msg("jira comment not posted (dry run)")
		return
	}
	if err := h.cfg.Jira.AddComment(ctx, ev.key, body); err != nil {
		ev.log.Warn().Err(err).Msg("could not post a jira comment (not critical)")
	}
}
