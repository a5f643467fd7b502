package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/fetcher"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// DefaultCommentMaxBytes bounds the text of a comment handed to an agent as a follow-up
// (Config.CommentMaxBytes): enough for "also update the tests" and a paragraph of why,
// not a pasted log. MinCommentMaxBytes is the smallest bound accepted.
const (
	DefaultCommentMaxBytes = 4096
	MinCommentMaxBytes     = 64
)

// maxCommentID bounds a comment id (Jira's are numbers): it names the follow-up's
// once marker.
const maxCommentID = 64

// truncatedMark ends a comment cut at Config.CommentMaxBytes.
const truncatedMark = "\n[truncated]"

// Text returns the comment's body as plain text: the string itself, or the text of an
// Atlassian Document Format body (paragraphs on lines of their own); "" for neither.
func (c *Comment) Text() string {
	if c == nil || len(c.Body) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(c.Body, &s) == nil {
		return s
	}
	var doc any
	if json.Unmarshal(c.Body, &doc) != nil {
		return ""
	}
	var b strings.Builder
	adfText(&b, doc, 0)
	return strings.TrimSpace(b.String())
}

// adfText writes the text nodes of an ADF tree, a block's end as a line break. The
// depth bound keeps a hostile document from recursing without end.
func adfText(b *strings.Builder, n any, depth int) {
	if depth > 64 {
		return
	}
	switch v := n.(type) {
	case map[string]any:
		if t, ok := v["text"].(string); ok {
			b.WriteString(t)
		}
		typ, _ := v["type"].(string)
		if typ == "hardBreak" {
			b.WriteByte('\n')
		}
		adfText(b, v["content"], depth+1)
		switch typ {
		case "paragraph", "heading", "listItem", "codeBlock", "blockquote", "rule":
			b.WriteByte('\n')
		}
	case []any:
		for _, x := range v {
			adfText(b, x, depth+1)
		}
	}
}

// commentBody is what an agent may read of a comment: ymirflow's own secrets
// (Config.Redactor) and anything shaped like a credential (redact.Tokens) masked, then
// cut to limit bytes on a character boundary, a cut body ending with "[truncated]".
// Masked before it is cut, so that no half of a secret survives the cut.
func commentBody(text string, red *redact.Redactor, limit int) string {
	text = redact.Tokens(red.String(text))
	if len(text) <= limit {
		return text
	}
	cut := limit - len(truncatedMark)
	for cut > 0 && !utf8.RuneStart(text[cut]) {
		cut--
	}
	return text[:cut] + truncatedMark
}

// handleComment makes a comment_created delivery a follow-up of each run that holds the
// issue: a comment.created event, published once per comment (its Jira id) to the
// twin of the stream of the entry that run is working on (its :todo twin, or the main
// stream for a :todo entry), with that entry's Task as payload. The
// busy policy of the worker reading that stream decides its fate (deliver: the run's
// mailbox). A comment on an issue no run holds starts nothing: work starts with
// labels (ymir_todo), which the trigger group check guards; comments have no such check.
func (r *Receiver) handleComment(ctx context.Context, e Event) result {
	key, err := r.locker.Canonicalize(e.Issue.Key)
	if err != nil {
		return accepted("skipped_"+string(fetcher.ReasonInvalidKey), err.Error())
	}
	if usd, ok := agentctl.ParseApproval(e.Comment.Text()); ok {
		return r.handleApproval(ctx, key, e, usd)
	}
	refs := make([]lease.Ref, 0, len(event.Agents))
	for _, a := range event.Agents {
		refs = append(refs, lease.Ref{Agent: a, Issue: key})
	}
	held, err := r.locker.InspectMany(ctx, refs)
	if err != nil {
		return result{status: http.StatusServiceUnavailable, outcome: "redis_unavailable", issue: key, detail: "Redis: lease lookup failed", err: err}
	}
	body := commentBody(e.Comment.Text(), r.cfg.Redactor, r.cfg.CommentMaxBytes)
	res := result{status: http.StatusAccepted, outcome: "comment_no_run", issue: key,
		detail: "no stage's run holds the issue: a comment starts no work"}
	var to []string
	for _, agent := range event.Agents {
		info, ok := held[lease.Ref{Agent: agent, Issue: key}]
		if !ok || info.MessageID == "" {
			continue // a Python agent's plain lock names no entry to follow
		}
		route, holder, err := r.holderEntry(ctx, agent, info.MessageID, info.Stream)
		if err != nil {
			return result{status: http.StatusServiceUnavailable, outcome: "redis_unavailable", issue: key, detail: "Redis: the held run's entry was not read", err: err}
		}
		if holder == nil {
			continue // its entry is gone: the run is ending
		}
		// To the twin of the run's stream (:todo for the main one, and back): its own
		// subscription reads it while the run goes on, so it meets the live lease. On the
		// run's stream, the run's subscription could read it ahead and hold it until the
		// run is over.
		stream := r.cfg.Topology.Stream(route.Agent, route.Branch, !route.Todo)
		msg := followupOf(key, e.Comment, body, holder)
		id, err := r.pub.PublishOnce(ctx, stream, msg, "comment:"+e.Comment.ID, r.cfg.DeliveryTTL)
		if err != nil {
			return result{status: http.StatusServiceUnavailable, outcome: "redis_unavailable", issue: key, detail: "Redis: follow-up not published", err: err}
		}
		res.entryID, res.stream = id, stream
		to = append(to, agent)
	}
	if len(to) > 0 {
		res.outcome = "followup_published"
		res.detail = fmt.Sprintf("comment %s by %s published as a follow-up to the run of %s", e.Comment.ID,
			e.Comment.Author.ID(), strings.Join(to, ", "))
	}
	return res
}

// holderEntry finds the entry id on one of agent's input streams (the entry its run
// holds the lease for), in one round trip; nil when no stream has it. When the lease
// names its entry's stream, only that stream is read: an agent's stream and its :todo
// twin repeat entry ids, and the other's entry of that id is another event.
func (r *Receiver) holderEntry(ctx context.Context, agent, id, stream string) (event.Route, *message.Message, error) {
	var routes []event.Route
	if agent == "triage" {
		routes = r.cfg.Topology.Inputs(agent, "")
	} else {
		for _, b := range event.Branches {
			routes = append(routes, r.cfg.Topology.Inputs(agent, b)...)
		}
	}
	if i := slices.IndexFunc(routes, func(rt event.Route) bool { return rt.Stream == stream }); i >= 0 {
		routes = routes[i : i+1]
	}
	pipe := r.cfg.Redis.Pipeline()
	cmds := make([]*redis.XMessageSliceCmd, len(routes))
	for i, rt := range routes {
		cmds[i] = pipe.XRangeN(ctx, rt.Stream, id, id, 1)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return event.Route{}, nil, err
	}
	for i, c := range cmds {
		if xs := c.Val(); len(xs) > 0 {
			return routes[i], event.DecodeEntry(routes[i].Stream, xs[0].ID, xs[0].Values), nil
		}
	}
	return event.Route{}, nil, nil
}

// followupOf is the comment.created event of a comment for the run whose entry is
// holder: the holder's Task as payload (so that, run on its own, it is that stage's
// request), its correlation id (the comment belongs to that issue run) and the comment.
func followupOf(key string, c *Comment, body string, holder *message.Message) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), holder.Payload)
	corr := holder.Metadata.Get(event.MetaCorrelationID)
	if corr == "" {
		corr = watermill.NewUUID()
	}
	ut, _ := strconv.ParseBool(holder.Metadata.Get(event.MetaUserTriggered))
	for k, v := range map[string]string{
		event.MetaEventType: event.CommentCreated, event.MetaIssueKey: key, event.MetaSchemaVersion: event.SchemaVersion,
		event.MetaAttempt: "0", event.MetaUserTriggered: strconv.FormatBool(ut), event.MetaCorrelationID: corr,
		event.MetaCausationID: holder.UUID, event.MetaCommentID: c.ID, event.MetaCommentAuthor: c.Author.ID(),
		event.MetaCommentBody: body,
	} {
		msg.Metadata.Set(k, v)
	}
	return msg
}
