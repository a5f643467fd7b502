package web

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/audit"
)

// The JSON API: the documents of the CLI's --json (inspect's report structs), plus
// the overview and the outcomes chart's data. Errors are {"error": ..., "status": N}.

type apiError struct {
	Error  string `json:"error"`
	Status int    `json:"status"`
}

type apiFunc func(r *http.Request) (any, error)

func (s *Server) api(f apiFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, err := f(r)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func (s *Server) apiOverview(r *http.Request) (any, error) { return s.overviewData(r) }

func (s *Server) apiStreams(r *http.Request) (any, error) {
	st, err := s.in.Streams(r.Context())
	if st == nil {
		st = []inspect.StreamInfo{}
	}
	return inspect.StreamsReport{Streams: st}, err
}

func (s *Server) apiPending(r *http.Request) (any, error) {
	f, err := s.pendingFilter(r.URL.Query())
	if err != nil {
		return nil, err
	}
	groups, err := s.in.Pending(r.Context(), f)
	if groups == nil {
		groups = []inspect.GroupPending{}
	}
	return inspect.PendingReport{Groups: groups}, err
}

func (s *Server) apiLeases(r *http.Request) (any, error) {
	ls, err := s.in.Locks(r.Context(), inspect.LockFilter{})
	if ls == nil {
		ls = []inspect.LeaseInfo{}
	}
	if err != nil {
		return inspect.LocksReport{Leases: ls}, err
	}
	slots, err := s.in.Slots(r.Context())
	if err != nil {
		return inspect.LocksReport{Leases: ls}, err
	}
	ps, err := s.in.Pauses(r.Context())
	return inspect.LocksReport{Leases: ls, Slots: slots, Pauses: ps}, err
}

func (s *Server) apiOutcomes(r *http.Request) (any, error) {
	window := time.Hour
	if v := r.URL.Query().Get("minutes"); v != "" {
		m, err := strconv.Atoi(v)
		if err != nil || m < 1 || m > 24*60 {
			return nil, badRequest("minutes must be a whole number from 1 to 1440")
		}
		window = time.Duration(m) * time.Minute
	}
	return s.in.Outcomes(r.Context(), window, time.Minute)
}

func (s *Server) apiIssue(r *http.Request) (any, error) { return s.history(r, r.PathValue("key")) }

func (s *Server) apiDeadLetters(r *http.Request) (any, error) {
	dls, err := s.deadList(r)
	if err != nil {
		return nil, err
	}
	return inspect.DeadLettersReport{DeadLetters: dls}, nil
}

func (s *Server) apiDeadLetter(r *http.Request) (any, error) {
	d, err := s.in.DeadLetter(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	s.scrub(&d)
	return d, nil
}

// readJSON decodes a write's body into v; unknown fields are refused.
func readJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		if errors.Is(err, io.EOF) {
			return badRequest("the body must be a JSON object")
		}
		return badRequest("the body is not the expected JSON: %v", err)
	}
	// Read the rest so that an oversized body is refused whole, not half-read.
	if _, err := io.Copy(io.Discard, r.Body); err != nil {
		return err
	}
	return nil
}

type idsBody struct {
	IDs    []string `json:"ids"`
	Reason string   `json:"reason"`
}

// selectedIDs reads the dead-letter ids a write acts on, and the context carrying the
// operator's reason.
func (s *Server) selectedIDs(r *http.Request) (context.Context, []string, error) {
	var b idsBody
	if err := readJSON(r, &b); err != nil {
		return nil, nil, err
	}
	sel, err := ids(b.IDs)
	return because(r.Context(), b.Reason), sel, err
}

func (s *Server) apiRequeue(r *http.Request) (any, error) {
	ctx, sel, err := s.selectedIDs(r)
	if err != nil {
		return nil, err
	}
	done, err := s.in.Requeue(ctx, sel...)
	if len(done) == 0 && !isPartial(err) {
		return nil, err
	}
	rep := inspect.RequeueReport{Requeued: done, Errors: []string{}}
	if rep.Requeued == nil {
		rep.Requeued = []inspect.Requeued{}
	}
	for _, e := range inspect.Errors(err) {
		rep.Errors = append(rep.Errors, s.clean(e.Error()))
	}
	s.cfg.Logger.Info().Int("requeued", len(done)).Msg("api: dead letters requeued")
	return rep, nil
}

// isPartial reports a Requeue error that is a list of per-entry errors only (some ids
// unknown or bad), not a refusal or a failure of the whole: the report says which. When
// nothing moved and every id was unknown, the request is answered with a 404 instead.
func isPartial(err error) bool {
	if err == nil {
		return true
	}
	if errors.Is(err, audit.ErrNoReason) || errors.Is(err, audit.ErrNotRecorded) || errors.Is(err, audit.ErrNoActor) {
		return false
	}
	errs := inspect.Errors(err)
	all := true
	for _, e := range errs {
		if !errors.Is(e, inspect.ErrNotFound) {
			all = false
		}
	}
	return !all
}

func (s *Server) apiPurge(r *http.Request) (any, error) {
	ctx, sel, err := s.selectedIDs(r)
	if err != nil {
		return nil, err
	}
	n, err := s.in.Delete(ctx, sel...)
	if err != nil {
		return nil, err
	}
	s.cfg.Logger.Info().Int64("purged", n).Msg("api: dead letters purged")
	return inspect.PurgeReport{Purged: n}, nil
}

type releaseBody struct {
	Agent  string `json:"agent"`
	Issue  string `json:"issue"`
	Reason string `json:"reason"`
}

func (s *Server) apiRelease(r *http.Request) (any, error) {
	var b releaseBody
	if err := readJSON(r, &b); err != nil {
		return nil, err
	}
	agent, issue, err := s.leaseRef(b.Agent, b.Issue)
	if err != nil {
		return nil, err
	}
	rel, err := s.in.ForceRelease(because(r.Context(), b.Reason), agent, issue)
	if err != nil {
		return nil, err
	}
	s.cfg.Logger.Info().Str("agent", agent).Str("issue_key", rel.Issue).Int64("fence", rel.Fence).Msg("api: lease force-released")
	return rel, nil
}

func (s *Server) apiAudit(r *http.Request) (any, error) {
	f, err := s.auditFilter(r)
	if err != nil {
		return nil, err
	}
	recs, err := s.in.Audit(r.Context(), f)
	if err != nil {
		return nil, err
	}
	return AuditReport{Records: s.scrubAudit(recs)}, nil
}
