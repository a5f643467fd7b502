package web

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ymirflow/ymirflow/internal/audit"
)

// AuditReport is GET /api/v1/audit: the operators' writes, newest first (the
// document of `ymirflow audit --json`).
type AuditReport struct {
	Records []audit.Record `json:"records"`
}

// auditFilter reads the audit page's filters: who, action, issue, since (a duration
// back from now, "24h", or an RFC 3339 time) and limit (1 to maxRows, default 100).
func (s *Server) auditFilter(r *http.Request) (audit.Filter, error) {
	q := r.URL.Query()
	f := audit.Filter{Who: strings.TrimSpace(q.Get("who")), Action: strings.TrimSpace(q.Get("action")),
		Issue: strings.TrimSpace(q.Get("issue")), Limit: 100}
	if len(f.Issue) > maxKeyLen {
		return f, s.badKey(f.Issue)
	}
	if len(f.Who) > 64 || len(f.Action) > 40 {
		return f, badRequest("who and action are at most 64 and 40 characters")
	}
	if v := strings.TrimSpace(q.Get("since")); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			f.Since = s.cfg.Now().Add(-d)
		} else if t, err := time.Parse(time.RFC3339, v); err == nil {
			f.Since = t
		} else {
			return f, badRequest("since must be a duration back from now (24h) or an RFC 3339 time, got %q", s.clip(v, 40))
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxRows {
			return f, badRequest("limit must be a whole number from 1 to %d", maxRows)
		}
		f.Limit = n
	}
	return f, nil
}

// scrubAudit redacts what an operator typed (a reason may quote a secret).
func (s *Server) scrubAudit(recs []audit.Record) []audit.Record {
	for i := range recs {
		r := &recs[i]
		r.Reason, r.Scope, r.Detail, r.From = s.clean(r.Reason), s.clean(r.Scope), s.clean(r.Detail), s.clean(r.From)
	}
	return recs
}

type auditData struct {
	Records []audit.Record
	Filter  audit.Filter
	Query   map[string]string
	Actions []string
}

func (s *Server) auditPage(_ http.ResponseWriter, r *http.Request) (*view, error) {
	f, err := s.auditFilter(r)
	if err != nil {
		return nil, err
	}
	recs, err := s.in.Audit(r.Context(), f)
	if err != nil {
		return nil, err
	}
	q := map[string]string{}
	for _, k := range []string{"who", "action", "issue", "since"} {
		q[k] = r.URL.Query().Get(k)
	}
	actions := []string{"release", "replay", "requeue", "purge", "pause", "resume", "drain"}
	if f.Action != "" && !slices.Contains(actions, f.Action) {
		actions = append(actions, f.Action)
	}
	return &view{name: "audit", Title: "Audit", Active: "audit",
		Data: auditData{Records: s.scrubAudit(recs), Filter: f, Query: q, Actions: actions}}, nil
}
