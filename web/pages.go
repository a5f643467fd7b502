package web

import (
	"bytes"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/presence"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// view is what a page handler renders: a template and its data.
type view struct {
	name   string // template set (page)
	Title  string
	Active string // navigation tab
	Data   any
	// Set by page() for the layout.
	Writable bool   // some operator can be identified
	SignedIn bool   // this browser has a session, or the trusted proxy names its user
	Who      string // the operator signed in
	Role     string // and its role
	CanWrite bool   // the operator may write (operator or admin)
	CSRF     string // the CSRF token of the operator's forms
	Refresh  int64  // ms; 0: the page does not refresh itself
	Notice   string
	Code     int // status code of an error page
	Path     string
	Pauses   []lease.Pause // the active pauses, for the banner
}

type pageFunc func(w http.ResponseWriter, r *http.Request) (*view, error)

// page renders a page handler's view, or its error as an error page; with
// ?fragment=1 only the part that refreshes itself ("live").
func (s *Server) page(f pageFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, err := f(w, r)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		if v == nil { // redirected
			return
		}
		s.render(w, r, v, http.StatusOK)
	})
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	code, msg := s.status(r, err)
	if strings.HasPrefix(r.URL.Path, "/api/") {
		writeJSON(w, code, apiError{Error: msg, Status: code})
		return
	}
	s.render(w, r, &view{name: "error", Title: http.StatusText(code), Data: msg, Code: code}, code)
}

func (s *Server) render(w http.ResponseWriter, r *http.Request, v *view, code int) {
	v.Writable = s.Writable()
	if id, ok := s.who(r); ok && id.Via != "bearer" {
		v.SignedIn, v.Who, v.Role, v.CanWrite = true, id.Name, id.Role, rank(id.Role) >= rank(RoleOperator)
		v.CSRF = s.formCSRF(r)
	}
	if v.Refresh == 0 && v.name != "error" && v.name != "login" && v.name != "release" && v.name != "deadletter" {
		v.Refresh = s.cfg.Refresh.Milliseconds()
	}
	v.Notice = notice(r.URL.Query())
	v.Path = r.URL.Path
	if v.name != "error" && v.name != "login" {
		v.Pauses = s.pausesBanner(r)
	}
	name := "layout.html"
	if r.URL.Query().Get("fragment") == "1" && v.name != "error" {
		name = "live"
	}
	var buf bytes.Buffer
	if err := s.pages[v.name].ExecuteTemplate(&buf, name, v); err != nil {
		s.cfg.Logger.Error().Err(err).Str("page", v.name).Msg("console template failed")
		http.Error(w, "internal error: the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// notice is the fixed message after a write action (never text from the URL).
func notice(q url.Values) string {
	n, _ := strconv.Atoi(q.Get("n"))
	switch q.Get("done") {
	case "requeued":
		return fmt.Sprintf("Requeued %d dead letter(s).", n)
	case "purged":
		return fmt.Sprintf("Purged %d dead letter(s).", n)
	case "released":
		return "Lease force-released; its fence was bumped, so the old holder is fenced out. " +
			"Its run stops within a second, and its entry runs again right after under a new lease."
	case "nothing":
		return "Nothing to release: nobody holds that lease any more (the request is in the audit trail all the same)."
	case "drained":
		return "Drain requested: its workers take no new work within 2 s, finish what runs, then show drained."
	case "undrained":
		return "Drain withdrawn: its workers take work again within 2 s."
	case "paused":
		return "Paused: no new run starts in the scope; its events wait in order."
	case "resumed":
		return "Resumed: the waiting events were appended to their streams again, in order."
	case "signedin":
		return "Signed in: write actions are on for this browser."
	case "signedout":
		return "Signed out."
	}
	return ""
}

func redirect(w http.ResponseWriter, r *http.Request, to string) (*view, error) {
	http.Redirect(w, r, to, http.StatusSeeOther)
	return nil, nil
}

// --- Overview ---

// Overview is the overview page's data and GET /api/v1/overview.
type Overview struct {
	Streams   []inspect.StreamInfo `json:"streams"`
	Running   []RunningRow         `json:"running"`
	Consumers []ConsumerRow        `json:"consumers"`
	Outcomes  inspect.Outcomes     `json:"outcomes"`
	// Drains are the standing drain requests (drain.go), shown in the banner.
	Drains       []inspect.DrainStatus `json:"drains"`
	DrainTargets []string              `json:"-"`
	Chart        chart                 `json:"-"`
	// PresenceTTL is how recent a worker's presence beat must be for it to be alive.
	PresenceTTL time.Duration `json:"-"`
}

// RunningRow is the work of one agent and branch: running (leases held), pending
// (delivered to a worker, not acknowledged), waiting (in its streams, not yet read by
// its group: the groups' lag, -1 when Redis cannot tell) and paused (events parked by
// operators' pauses, ymirflow pause).
type RunningRow struct {
	Agent   string `json:"agent"`
	Branch  string `json:"branch,omitempty"`
	Running int    `json:"running"`
	Issues  string `json:"issues"` // the issues held, comma separated
	Pending int64  `json:"pending"`
	Waiting int64  `json:"waiting"`
	Paused  int64  `json:"paused"`
}

// ConsumerRow is one consumer of one group and whether it is alive.
type ConsumerRow struct {
	Stream  string `json:"stream"`
	Group   string `json:"group"`
	Name    string `json:"name"`
	Pending int64  `json:"pending"`
	IdleMS  int64  `json:"idle_ms"` // -1: Redis did not say, or it has not read yet
	// State is the worker's own word (inspect.ConsumerAlive, ConsumerDead or
	// ConsumerNoBeat); Alive is State == alive.
	State string `json:"state"`
	Alive bool   `json:"alive"`
	// Recent: a consumer without presence beats that read within ConsumerIdle (a worker
	// that does not report its presence, say a Python agent).
	Recent   bool       `json:"recent"`
	Process  string     `json:"process,omitempty"`
	LastSeen *time.Time `json:"last_seen,omitempty"`
	// Drain is a live worker's drain state (drainreq.Draining, drainreq.Drained).
	Drain string `json:"drain,omitempty"`
}

func (s *Server) overviewData(r *http.Request) (Overview, error) {
	ctx := r.Context()
	streams, err := s.in.Streams(ctx)
	if err != nil {
		return Overview{}, err
	}
	running, err := s.in.Running(ctx)
	if err != nil {
		return Overview{}, err
	}
	outcomes, err := s.outcomes(r)
	if err != nil {
		return Overview{}, err
	}
	parked, err := s.in.ParkedPerStream(ctx)
	if err != nil {
		return Overview{}, err
	}
	ov := Overview{Streams: streams, Outcomes: outcomes, Running: []RunningRow{}, Consumers: []ConsumerRow{},
		PresenceTTL: presence.TTL}
	if ov.Streams == nil {
		ov.Streams = []inspect.StreamInfo{}
	}
	type ab struct{ a, b string }
	held := map[ab][]string{}
	for _, l := range running {
		k := ab{l.Lease.Agent, l.Branch}
		held[k] = append(held[k], l.Lease.Issue)
	}
	seen := map[ab]bool{}
	for _, rt := range s.cfg.Topology.AllInputs() {
		k := ab{rt.Agent, rt.Branch}
		if seen[k] {
			continue
		}
		seen[k] = true
		row := RunningRow{Agent: rt.Agent, Branch: rt.Branch, Running: len(held[k]), Issues: strings.Join(held[k], ", ")}
		row.Pending, row.Waiting = queued(streams, rt.Agent, rt.Branch)
		row.Paused = parkedOf(parked, s.cfg.Topology, rt.Agent, rt.Branch)
		ov.Running = append(ov.Running, row)
	}
	for k, issues := range held {
		if !seen[k] { // the guarded entry is in none of the agent's streams
			ov.Running = append(ov.Running, RunningRow{Agent: k.a, Branch: "?", Running: len(issues), Issues: strings.Join(issues, ", ")})
		}
	}
	for _, st := range streams {
		for _, g := range st.Groups {
			for _, c := range g.Consumers {
				idle := c.Idle.Milliseconds()
				if c.Idle < 0 {
					idle = -1
				}
				ov.Consumers = append(ov.Consumers, ConsumerRow{Stream: st.Stream, Group: g.Name, Name: c.Name, Pending: c.Pending,
					IdleMS: idle, State: c.State, Alive: c.State == inspect.ConsumerAlive, Process: c.Process, LastSeen: c.LastSeen, Drain: c.Drain,
					Recent: c.State == inspect.ConsumerNoBeat && c.Idle >= 0 && c.Idle <= s.cfg.ConsumerIdle})
			}
		}
	}
	ov.Chart = newChart(outcomes)
	if ov.Drains, err = s.in.Drains(ctx); err != nil {
		return Overview{}, err
	}
	ov.DrainTargets = s.drainTargets()
	return ov, nil
}

// queued sums the pending entries and the lag of agent's and branch's input groups
// (waiting -1 when a lag is unknown).
func queued(streams []inspect.StreamInfo, agent, branch string) (pending, waiting int64) {
	for _, st := range streams {
		if st.Kind != inspect.KindInput || st.Agent != agent || st.Branch != branch {
			continue
		}
		for _, g := range st.Groups {
			pending += g.Pending
			if g.Lag < 0 || waiting < 0 {
				waiting = -1
				continue
			}
			waiting += g.Lag
		}
		if len(st.Groups) == 0 && waiting >= 0 {
			waiting += st.Length // no group yet: every entry waits for one
		}
	}
	return pending, waiting
}

func (s *Server) overview(_ http.ResponseWriter, r *http.Request) (*view, error) {
	ov, err := s.overviewData(r)
	if err != nil {
		return nil, err
	}
	return &view{name: "overview", Title: "Overview", Active: "overview", Data: ov}, nil
}

// --- Leases ---

// LeasesPage is the Leases page: the live leases, and the concurrency limits' slots
// (RUN_LIMITS: each limit key's slots used of its limit and the events waiting for
// one), as `locks` and /api/v1/leases show them.
type LeasesPage struct {
	Running []inspect.RunningLease
	Slots   []inspect.SlotInfo
	Now     time.Time
}

func (s *Server) leases(_ http.ResponseWriter, r *http.Request) (*view, error) {
	running, err := s.in.Running(r.Context())
	if err != nil {
		return nil, err
	}
	slots, err := s.in.Slots(r.Context())
	if err != nil {
		return nil, err
	}
	return &view{name: "leases", Title: "Leases", Active: "leases",
		Data: LeasesPage{Running: running, Slots: slots, Now: time.Now()}}, nil
}

// badKey is the 400 for an issue key that is not one (too long to look up, or empty),
// in the CLI's words (inspect.BadKey).
func (s *Server) badKey(key string) error { return badRequest("%s", s.clean(inspect.BadKey(key))) }

// leaseRef reads and checks agent and issue of a force release.
func (s *Server) leaseRef(agent, issue string) (string, string, error) {
	if !slices.Contains(event.Agents, agent) {
		return "", "", badRequest("unknown agent %q (one of %s)", s.clip(agent, 40), strings.Join(event.Agents, ", "))
	}
	issue = strings.TrimSpace(issue)
	if issue == "" || len(issue) > maxKeyLen {
		return "", "", s.badKey(issue)
	}
	return agent, issue, nil
}

func (s *Server) releaseConfirm(_ http.ResponseWriter, r *http.Request) (*view, error) {
	agent, issue, err := s.leaseRef(r.URL.Query().Get("agent"), r.URL.Query().Get("issue"))
	if err != nil {
		return nil, err
	}
	l, err := s.in.Lease(r.Context(), agent, issue)
	if err != nil {
		return nil, err
	}
	return &view{name: "release", Title: "Force release", Active: "leases", Data: l}, nil
}

func (s *Server) releasePost(w http.ResponseWriter, r *http.Request) (*view, error) {
	agent, issue, err := s.leaseRef(r.PostFormValue("agent"), r.PostFormValue("issue"))
	if err != nil {
		return nil, err
	}
	rel, err := s.in.ForceRelease(because(r.Context(), r.PostFormValue("reason")), agent, issue)
	if err != nil {
		return nil, err
	}
	s.cfg.Logger.Info().Str("agent", agent).Str("issue_key", rel.Issue).Int64("fence", rel.Fence).Msg("console: lease force-released")
	if rel.Holder == nil {
		return redirect(w, r, "/leases?done=nothing")
	}
	return redirect(w, r, "/leases?done=released")
}

// --- Pending ---

// pendingFilter reads the optional agent, branch and issue filters.
func (s *Server) pendingFilter(q url.Values) (inspect.PendingFilter, error) {
	f := inspect.PendingFilter{Agent: q.Get("agent"), Branch: q.Get("branch"), Issue: strings.TrimSpace(q.Get("issue"))}
	if f.Agent != "" && !slices.Contains(event.Agents, f.Agent) {
		return f, badRequest("unknown agent %q (one of %s)", s.clip(f.Agent, 40), strings.Join(event.Agents, ", "))
	}
	if f.Branch != "" && !slices.Contains(s.branches(), f.Branch) {
		return f, badRequest("unknown branch %q (one of %s)", s.clip(f.Branch, 40), strings.Join(s.branches(), ", "))
	}
	if len(f.Issue) > maxKeyLen {
		return f, s.badKey(f.Issue)
	}
	return f, nil
}

func (s *Server) branches() []string {
	var out []string
	for _, r := range s.cfg.Topology.AllInputs() {
		if r.Branch != "" && !slices.Contains(out, r.Branch) {
			out = append(out, r.Branch)
		}
	}
	return out
}

func (s *Server) pending(_ http.ResponseWriter, r *http.Request) (*view, error) {
	f, err := s.pendingFilter(r.URL.Query())
	if err != nil {
		return nil, err
	}
	groups, err := s.in.Pending(r.Context(), f)
	if err != nil {
		return nil, err
	}
	// A page shows the oldest maxRows entries of a group (the API has them all), and
	// the groups with nothing pending on one line: they are most of them at rest.
	data := pendingData{Groups: []inspect.GroupPending{}}
	for _, g := range groups {
		if g.Count == 0 && len(g.Delayed) == 0 && !g.NoGroup {
			data.Empty = append(data.Empty, g.Stream)
			continue
		}
		g.Entries = g.Entries[:min(len(g.Entries), maxRows)]
		data.Groups = append(data.Groups, g)
	}
	data.Any = len(groups) > 0
	return &view{name: "pending", Title: "Pending", Active: "pending", Data: data}, nil
}

// pendingData is the pending page: the groups with pending entries, and the streams
// whose group has none.
type pendingData struct {
	Groups []inspect.GroupPending
	Empty  []string
	Any    bool // some group exists
}

// --- Issue ---

type issueData struct {
	Query   string
	Issue   string
	Events  []inspect.HistoryEvent
	Indexed int
	// Scanned says which older entries were scanned (the per-issue index did not
	// cover them); nil when the index answered alone.
	Scanned *inspect.HistoryScan
	// Story draws the events over time, one lane per agent and branch.
	Story story
	// Cost is the issue's spend from the agents' ledger (shown when any was reported
	// or a budget raised).
	Cost inspect.IssueCost
}

// history reads an issue's timeline; any key form is accepted (" rhel-123 ").
func (s *Server) history(r *http.Request, raw string) (inspect.HistoryReport, error) {
	raw = strings.TrimSpace(raw)
	if len(raw) > maxKeyLen {
		return inspect.HistoryReport{}, s.badKey(raw)
	}
	rep, err := s.in.Timeline(r.Context(), raw)
	if err != nil {
		return inspect.HistoryReport{}, err
	}
	if len(rep.Events) == 0 {
		rep.Issue = raw
	}
	if rep.Events == nil {
		rep.Events = []inspect.HistoryEvent{}
	}
	for i := range rep.Events {
		rep.Events[i].Detail = s.clean(rep.Events[i].Detail)
	}
	return rep, nil
}

func (s *Server) issue(_ http.ResponseWriter, r *http.Request) (*view, error) {
	q := r.URL.Query().Get("key")
	v := &view{name: "issue", Title: "Issue", Active: "issue", Data: issueData{Query: q}}
	if strings.TrimSpace(q) == "" {
		return v, nil
	}
	rep, err := s.history(r, q)
	if err != nil {
		return nil, err
	}
	if len(rep.Events) == 0 {
		return nil, &httpError{http.StatusNotFound, fmt.Sprintf("no events of %s in any stream (the streams keep only their latest entries)", s.clip(q, maxKeyLen))}
	}
	cost, err := s.in.Cost(r.Context(), rep.Issue)
	if err != nil {
		return nil, err
	}
	v.Title = rep.Issue
	v.Data = issueData{Query: q, Issue: rep.Issue, Events: rep.Events, Indexed: rep.Indexed, Scanned: rep.Scanned,
		Story: s.newStory(rep.Events), Cost: cost}
	return v, nil
}

// --- Dead letters ---

func (s *Server) deadList(r *http.Request) ([]inspect.DeadLetter, error) {
	issue := strings.TrimSpace(r.URL.Query().Get("issue"))
	if len(issue) > maxKeyLen {
		return nil, s.badKey(issue)
	}
	dls, err := s.in.DeadLetters(r.Context(), inspect.DeadFilter{Issue: issue})
	if err != nil {
		return nil, err
	}
	for i := range dls {
		s.scrub(&dls[i])
	}
	// Newest first: what just died is what the operator looks for.
	slices.Reverse(dls)
	return dls, nil
}

// scrub redacts what an agent or a producer may have written into a dead letter.
func (s *Server) scrub(d *inspect.DeadLetter) {
	d.Error = s.bound(d.Error)
	d.Payload = s.bound(d.Payload)
	for k, v := range d.Metadata {
		d.Metadata[k] = s.bound(v)
	}
}

// deadPage is the dead-letter list as shown: the newest maxRows of Total.
type deadPage struct {
	Rows  []inspect.DeadLetter
	Total int
}

func (s *Server) deadLetters(_ http.ResponseWriter, r *http.Request) (*view, error) {
	var page deadPage
	if r.URL.Query().Get("issue") == "" {
		// The newest rows only, however long the stream.
		dls, n, err := s.in.NewestDeadLetters(r.Context(), maxRows)
		if err != nil {
			return nil, err
		}
		for i := range dls {
			s.scrub(&dls[i])
		}
		page = deadPage{Rows: dls, Total: int(n)}
	} else {
		dls, err := s.deadList(r)
		if err != nil {
			return nil, err
		}
		page = deadPage{Rows: dls[:min(len(dls), maxRows)], Total: len(dls)}
	}
	return &view{name: "dead", Title: "Dead letters", Active: "dead", Data: page}, nil
}

func (s *Server) deadLetter(_ http.ResponseWriter, r *http.Request) (*view, error) {
	d, err := s.in.DeadLetter(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	s.scrub(&d)
	return &view{name: "deadletter", Title: "Dead letter " + d.ID, Active: "dead", Data: d}, nil
}

// ids reads the selected dead-letter ids of a form.
func ids(vals []string) ([]string, error) {
	if len(vals) == 0 {
		return nil, badRequest("select at least one dead letter")
	}
	if len(vals) > maxIDs {
		return nil, badRequest("at most %d dead letters at a time (got %d)", maxIDs, len(vals))
	}
	for _, id := range vals {
		if err := inspect.CheckID(id); err != nil {
			return nil, err
		}
	}
	return vals, nil
}

func (s *Server) deadLettersPost(w http.ResponseWriter, r *http.Request) (*view, error) {
	sel, err := ids(r.PostForm["id"])
	if err != nil {
		return nil, err
	}
	ctx := because(r.Context(), r.PostFormValue("reason"))
	switch r.PostFormValue("op") {
	case "requeue":
		done, err := s.in.Requeue(ctx, sel...)
		if err != nil && len(done) == 0 {
			return nil, err
		}
		s.cfg.Logger.Info().Int("requeued", len(done)).Msg("console: dead letters requeued")
		return redirect(w, r, fmt.Sprintf("/dead-letters?done=requeued&n=%d", len(done)))
	case "purge":
		n, err := s.in.Delete(ctx, sel...)
		if err != nil {
			return nil, err
		}
		s.cfg.Logger.Info().Int64("purged", n).Msg("console: dead letters purged")
		return redirect(w, r, fmt.Sprintf("/dead-letters?done=purged&n=%d", n))
	}
	return nil, badRequest("op must be requeue or purge")
}

// --- Sign in ---

func (s *Server) loginPage(_ http.ResponseWriter, r *http.Request) (*view, error) {
	return &view{name: "login", Title: "Sign in", Data: localPath(r.URL.Query().Get("next"))}, nil
}

func (s *Server) loginPost(w http.ResponseWriter, r *http.Request) (*view, error) {
	if !s.Writable() {
		return nil, &httpError{http.StatusForbidden, s.readOnlyMsg()}
	}
	if err := sameOrigin(r); err != nil {
		return nil, err
	}
	op, ok := s.byToken(r.PostFormValue("token"))
	if !ok {
		s.cfg.Logger.Warn().Str("remote", r.RemoteAddr).Msg("console: sign-in with a wrong token")
		return nil, &httpError{http.StatusUnauthorized, "refused: that is not an operator's token"}
	}
	s.cfg.Logger.Info().Str("operator", op.Name).Str("role", op.Role).Str("remote", r.RemoteAddr).Msg("console: signed in")
	s.newSession(w, r, op.Name)
	next := localPath(r.PostFormValue("next"))
	sep := "?"
	if strings.Contains(next, "?") {
		sep = "&"
	}
	return redirect(w, r, next+sep+"done=signedin")
}

func (s *Server) logoutPost(w http.ResponseWriter, r *http.Request) (*view, error) {
	if err := sameOrigin(r); err != nil {
		return nil, err
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	return redirect(w, r, "/?done=signedout")
}

// outcomesTTL is how long the overview reuses the chart's counts: reading an hour of
// results on every 2 s refresh would cost far more than the chart is worth.
const outcomesTTL = 10 * time.Second

func (s *Server) outcomes(r *http.Request) (inspect.Outcomes, error) {
	s.chartMu.Lock()
	defer s.chartMu.Unlock()
	if now := s.cfg.Now(); now.Sub(s.chartAt) >= outcomesTTL {
		o, err := s.in.Outcomes(r.Context(), time.Hour, time.Minute)
		if err != nil {
			return inspect.Outcomes{}, err
		}
		s.chart, s.chartAt = o, now
	}
	return s.chart, nil
}

// parkedOf is how many events pauses hold back from the agent and branch's streams
// (its :todo twin included).
func parkedOf(parked map[string]int64, topo event.Topology, agent, branch string) int64 {
	return parked[topo.Stream(agent, branch, false)] + parked[topo.Stream(agent, branch, true)]
}
