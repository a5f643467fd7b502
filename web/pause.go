package web

import (
	"errors"
	"net/http"
	"net/url"

	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// Pause and resume in the console (issue 38): the banner of active pauses on every
// page, the pauses page with its forms (operator role), and /api/v1/pauses.

// pausesBanner reads the active pauses for the layout's banner; a failure shows none
// (the page itself says what is wrong with Redis).
func (s *Server) pausesBanner(r *http.Request) []lease.Pause {
	ps, err := s.in.Pauses(r.Context())
	if err != nil {
		return nil
	}
	return ps
}

func (s *Server) pausesPage(_ http.ResponseWriter, r *http.Request) (*view, error) {
	ps, err := s.in.Pauses(r.Context())
	if err != nil {
		return nil, err
	}
	return &view{name: "pauses", Title: "Pauses", Active: "pauses", Data: ps}, nil
}

// pauseOp picks the action of a pause form: pause or resume (both operator).
func pauseOp(r *http.Request) (string, string, error) {
	switch r.PostFormValue("op") {
	case "pause":
		return inspect.ActionPause, RoleOperator, nil
	case "resume":
		return inspect.ActionResume, RoleOperator, nil
	}
	return "", "", badRequest("op must be pause or resume")
}

func (s *Server) pausesPost(w http.ResponseWriter, r *http.Request) (*view, error) {
	ctx := because(r.Context(), r.PostFormValue("reason"))
	scope := r.PostFormValue("scope")
	var err error
	done := "paused"
	if r.PostFormValue("op") == "resume" {
		done = "resumed"
		_, err = s.in.Resume(ctx, scope)
	} else {
		_, err = s.in.Pause(ctx, scope, r.PostFormValue("stop_running") == "on")
	}
	if err != nil {
		return nil, pauseErr(err)
	}
	s.cfg.Logger.Info().Str("scope", scope).Str("op", done).Msg("console: " + done)
	return redirect(w, r, "/pauses?"+url.Values{"done": {done}}.Encode())
}

// pauseErr makes a bad scope a 400.
func pauseErr(err error) error {
	if errors.Is(err, lease.ErrBadPauseScope) {
		return badRequest("%v", err)
	}
	return err
}

type pauseBody struct {
	Scope       string `json:"scope"`
	Reason      string `json:"reason"`
	StopRunning bool   `json:"stop_running"`
}

func (s *Server) apiPauses(r *http.Request) (any, error) {
	ps, err := s.in.Pauses(r.Context())
	if err != nil {
		return nil, err
	}
	if ps == nil {
		ps = []lease.Pause{}
	}
	return inspect.PauseList{Pauses: ps}, nil
}

func (s *Server) apiPause(r *http.Request) (any, error) {
	var b pauseBody
	if err := readJSON(r, &b); err != nil {
		return nil, err
	}
	p, err := s.in.Pause(because(r.Context(), b.Reason), b.Scope, b.StopRunning)
	return p, pauseErr(err)
}

func (s *Server) apiResume(r *http.Request) (any, error) {
	var b pauseBody
	if err := readJSON(r, &b); err != nil {
		return nil, err
	}
	res, err := s.in.Resume(because(r.Context(), b.Reason), b.Scope)
	return res, pauseErr(err)
}
