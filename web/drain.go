package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/drainreq"
)

// Worker drain in the console (docs/operations.md, "Maintenance and upgrades: drain"):
// the overview's banner lists the standing requests with how many of their workers
// report drained, each with an undo; its form and POST /api/v1/drain ask for one. A
// drain of every worker needs the admin role; of an agent or one worker, operator.

// Audit actions of the drain routes (inspect's Drain and Undrain record them).
const (
	ActionDrain   = "drain"
	ActionUndrain = "undrain"
)

// drainBody is a drain request: the form's fields or POST /api/v1/drain's JSON.
type drainBody struct {
	All    bool   `json:"all"`
	Agent  string `json:"agent"`
	Branch string `json:"branch"`
	Worker string `json:"worker"`
	Undo   bool   `json:"undo"`
	Reason string `json:"reason"`
}

func (b drainBody) target() drainreq.Target {
	return drainreq.Target{All: b.All, Agent: strings.TrimSpace(b.Agent), Branch: strings.TrimSpace(b.Branch),
		Worker: strings.TrimSpace(b.Worker)}
}

// readDrainBody reads the form, or the JSON body (put back for the handler).
func readDrainBody(r *http.Request) (drainBody, error) {
	if !strings.HasPrefix(r.URL.Path, "/api/") {
		t := drainreq.Target{All: r.PostFormValue("target") == "all"}
		if v, ok := strings.CutPrefix(r.PostFormValue("target"), "agent:"); ok {
			t.Agent, t.Branch, _ = strings.Cut(v, ":")
		}
		if v, ok := strings.CutPrefix(r.PostFormValue("target"), "worker:"); ok {
			t.Worker = v
		}
		if w := strings.TrimSpace(r.PostFormValue("worker")); w != "" && r.PostFormValue("target") == "worker" {
			t.Worker = w
		}
		return drainBody{All: t.All, Agent: t.Agent, Branch: t.Branch, Worker: t.Worker,
			Undo: r.PostFormValue("op") == "undrain", Reason: r.PostFormValue("reason")}, nil
	}
	raw, err := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(raw))
	if err != nil {
		return drainBody{}, err
	}
	var b drainBody
	if err := json.Unmarshal(raw, &b); err != nil {
		return drainBody{}, badRequest("the body is not a drain request: %s", err)
	}
	return b, nil
}

// drainOp picks a drain route's action and role: admin for every worker, else operator.
func drainOp(r *http.Request) (string, string, error) {
	b, err := readDrainBody(r)
	if err != nil {
		return "", "", err
	}
	action := ActionDrain
	if b.Undo {
		action = ActionUndrain
	}
	if b.All {
		return action, RoleAdmin, nil
	}
	return action, RoleOperator, nil
}

// doDrain asks for (or withdraws) the drain of b's target.
func (s *Server) doDrain(r *http.Request, b drainBody) (drainreq.Target, error) {
	t := b.target()
	if err := t.Check(); err != nil {
		return t, badRequest("%s", s.clean(err.Error()))
	}
	ctx := because(r.Context(), b.Reason)
	var err error
	if b.Undo {
		err = s.in.Undrain(ctx, t)
	} else {
		err = s.in.Drain(ctx, t)
	}
	if errors.Is(err, inspect.ErrNoDrain) {
		return t, &httpError{http.StatusNotFound, err.Error()}
	}
	if err == nil {
		s.cfg.Logger.Info().Str("target", t.String()).Bool("undo", b.Undo).Msg("console: drain requested")
	}
	return t, err
}

// DrainsReport is GET /api/v1/drains and POST /api/v1/drain's answer: the standing
// requests with their workers.
type DrainsReport struct {
	Drains []inspect.DrainStatus `json:"drains"`
}

func (s *Server) drainsReport(r *http.Request) (DrainsReport, error) {
	ds, err := s.in.Drains(r.Context())
	if ds == nil {
		ds = []inspect.DrainStatus{}
	}
	return DrainsReport{Drains: ds}, err
}

func (s *Server) apiDrains(r *http.Request) (any, error) { return s.drainsReport(r) }

func (s *Server) apiDrain(r *http.Request) (any, error) {
	var b drainBody
	if err := readJSON(r, &b); err != nil {
		return nil, err
	}
	if _, err := s.doDrain(r, b); err != nil {
		return nil, err
	}
	return s.drainsReport(r)
}

func (s *Server) drainPost(w http.ResponseWriter, r *http.Request) (*view, error) {
	b, err := readDrainBody(r)
	if err != nil {
		return nil, err
	}
	if _, err := s.doDrain(r, b); err != nil {
		return nil, err
	}
	if b.Undo {
		return redirect(w, r, "/?done=undrained")
	}
	return redirect(w, r, "/?done=drained")
}

// drainTargets are the form's choices: every worker, each agent and branch.
func (s *Server) drainTargets() []string {
	out := []string{"all"}
	seen := map[string]bool{}
	for _, rt := range s.cfg.Topology.AllInputs() {
		for _, f := range []string{"agent:" + rt.Agent, "agent:" + rt.Agent + ":" + rt.Branch} {
			if !seen[f] && !strings.HasSuffix(f, ":") {
				seen[f] = true
				out = append(out, f)
			}
		}
	}
	return append(out, "worker")
}
