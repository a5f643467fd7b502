package fakejira

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ymirflow/ymirflow/internal/jira"
)

// reply is what a route computes under the lock; ServeHTTP writes it after unlocking.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func jsonReply(status int, v any) reply {
	if v == nil {
		return reply{status: status}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return errReply(http.StatusInternalServerError, "fakejira: encode: "+err.Error())
	}
	return reply{status: status, body: b}
}

// errReply answers in Jira's error shape.
func errReply(status int, msgs ...string) reply {
	if msgs == nil {
		msgs = []string{}
	}
	return jsonReply(status, map[string]any{"errorMessages": msgs, "errors": map[string]string{}})
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body []byte
	if r.Body != nil {
		b, err := io.ReadAll(io.LimitReader(r.Body, 10<<20))
		if err != nil {
			http.Error(w, "fakejira: read body: "+err.Error(), http.StatusBadRequest)
			return
		}
		body = b
	}

	s.mu.Lock()
	rep := s.handle(r, body)
	s.requests = append(s.requests, Request{
		Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery,
		Authorization: r.Header.Get("Authorization"), Status: rep.status, At: s.opts.Clock(),
	})
	if len(s.requests) > maxLog {
		s.requests = slices.Delete(s.requests, 0, len(s.requests)-maxLog)
	}
	s.mu.Unlock()

	for k, v := range rep.header {
		w.Header()[k] = v
	}
	if rep.body != nil {
		w.Header().Set("Content-Type", "application/json;charset=UTF-8")
	}
	w.WriteHeader(rep.status)
	if rep.body != nil {
		_, _ = w.Write(rep.body)
	}
}

// handle runs with s.mu held.
func (s *Server) handle(r *http.Request, body []byte) reply {
	if rep, ok := s.injectedFault(); ok {
		return rep
	}
	if rep, limited := s.rateLimited(); limited {
		return rep
	}
	if !s.authorized(r) {
		rep := errReply(http.StatusUnauthorized, "You are not authenticated. Authentication required to perform this operation.")
		rep.header = http.Header{"Www-Authenticate": {`Basic realm="fakejira"`}}
		return rep
	}

	var rest, version string
	for _, v := range []string{"2", "3", "latest"} {
		if p, ok := strings.CutPrefix(r.URL.Path, "/rest/api/"+v+"/"); ok {
			rest, version = p, v
			break
		}
	}
	if version == "" {
		return errReply(http.StatusNotFound, "fakejira: no such endpoint "+r.URL.Path)
	}
	return s.route(r, body, version, strings.TrimSuffix(rest, "/"))
}

// injectedFault is the next failure FailNext injected, if any is left.
func (s *Server) injectedFault() (reply, bool) {
	if len(s.faults) == 0 {
		return reply{}, false
	}
	f := &s.faults[0]
	rep := errReply(f.status, fmt.Sprintf("fakejira: injected failure %d", f.status))
	if f.retryAfter != "" {
		rep.header = http.Header{"Retry-After": {f.retryAfter}}
	}
	f.n--
	if f.n <= 0 {
		s.faults = s.faults[1:]
	}
	return rep, true
}

// route answers an authorized request for rest, the path after /rest/api/VERSION/.
func (s *Server) route(r *http.Request, body []byte, version, rest string) reply {
	parts := strings.Split(rest, "/")
	method := r.Method

	switch {
	case rest == "search/jql" || rest == "search":
		return s.routeSearch(r, body, version, rest)
	case parts[0] == "issue":
		if rep, ok := s.routeIssue(r, body, parts); ok {
			return rep
		}
	case rest == "user/groups" && method == http.MethodGet:
		return s.userGroups(r)
	case rest == "user" && method == http.MethodGet:
		return s.user(r)
	case rest == "myself" && method == http.MethodGet:
		return jsonReply(http.StatusOK, s.opts.CurrentUser)
	}
	return errReply(http.StatusNotFound, "fakejira: no such endpoint "+r.Method+" "+r.URL.Path)
}

// routeSearch answers search/jql (Cloud's) and search (Data Center's; gone from API 3).
func (s *Server) routeSearch(r *http.Request, body []byte, version, rest string) reply {
	if rest == "search" && version == "3" {
		return errReply(http.StatusGone, "The requested API has been removed. Please migrate to the /rest/api/3/search/jql API.")
	}
	if r.Method != http.MethodGet && r.Method != http.MethodPost {
		return errReply(http.StatusMethodNotAllowed)
	}
	return s.search(r, body, rest == "search/jql")
}

// routeIssue answers the issue endpoints (parts is the path split at "/", parts[0]
// "issue"); ok is false for a path that is none of them.
func (s *Server) routeIssue(r *http.Request, body []byte, parts []string) (rep reply, ok bool) {
	method := r.Method
	switch {
	case len(parts) == 1 && method == http.MethodPost:
		return s.createIssue(r, body), true
	case len(parts) == 2:
		switch method {
		case http.MethodGet:
			return s.getIssue(r, parts[1]), true
		case http.MethodPut:
			return s.putIssue(r, parts[1], body), true
		}
		return errReply(http.StatusMethodNotAllowed), true
	case len(parts) == 3 && parts[2] == "comment":
		switch method {
		case http.MethodGet:
			return s.listComments(parts[1]), true
		case http.MethodPost:
			return s.addComment(r, parts[1], body), true
		}
		return errReply(http.StatusMethodNotAllowed), true
	case len(parts) == 3 && parts[2] == "changelog" && method == http.MethodGet:
		return s.changelog(r, parts[1]), true
	}
	return reply{}, false
}

func (s *Server) authorized(r *http.Request) bool {
	if s.opts.Token == "" {
		return true
	}
	if s.opts.Email != "" {
		u, p, ok := r.BasicAuth()
		return ok && u == s.opts.Email && p == s.opts.Token
	}
	return r.Header.Get("Authorization") == "Bearer "+s.opts.Token
}

type searchParams struct {
	JQL           string   `json:"jql"`
	MaxResults    *int     `json:"maxResults"`
	StartAt       int      `json:"startAt"`
	Fields        []string `json:"fields"`
	NextPageToken string   `json:"nextPageToken"`
	Expand        any      `json:"expand"`
}

func (s *Server) search(r *http.Request, body []byte, cloud bool) reply {
	var p searchParams
	if r.Method == http.MethodPost {
		if err := json.Unmarshal(body, &p); err != nil {
			return errReply(http.StatusBadRequest, "fakejira: bad search body: "+err.Error())
		}
	} else {
		q := r.URL.Query()
		p.JQL, p.NextPageToken = q.Get("jql"), q.Get("nextPageToken")
		if v := q.Get("maxResults"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				return errReply(http.StatusBadRequest, "maxResults must be a number")
			}
			p.MaxResults = &n
		}
		if v := q.Get("startAt"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				return errReply(http.StatusBadRequest, "startAt must be a number")
			}
			p.StartAt = n
		}
		if v := q.Get("fields"); v != "" {
			p.Fields = strings.Split(v, ",")
		}
	}
	size := s.opts.DefaultPageSize
	if p.MaxResults != nil && *p.MaxResults > 0 {
		size = *p.MaxResults
	}
	size = min(size, s.opts.MaxPageSize)

	start := p.StartAt
	if cloud {
		start = 0
		if p.NextPageToken != "" {
			n, err := decodeToken(p.NextPageToken)
			if err != nil {
				return errReply(http.StatusBadRequest, err.Error())
			}
			start = n
		}
	}
	if start < 0 {
		return errReply(http.StatusBadRequest, "startAt must not be negative")
	}
	all := s.issues
	if k, ok := jqlKey(p.JQL); ok {
		all = nil
		if is, found := s.byKey[k]; found {
			all = []*Issue{is}
		}
	}
	start = min(start, len(all))
	end := min(start+size, len(all))
	issues := make([]map[string]any, 0, end-start)
	for _, is := range all[start:end] {
		issues = append(issues, s.render(r.Host, is, p.Fields, false))
	}
	if cloud {
		out := map[string]any{"issues": issues, "isLast": end >= len(all)}
		if end < len(all) {
			out["nextPageToken"] = encodeToken(end)
		}
		return jsonReply(http.StatusOK, out)
	}
	return jsonReply(http.StatusOK, map[string]any{
		"expand": "schema,names", "startAt": start, "maxResults": size, "total": len(all), "issues": issues,
	})
}

func (s *Server) lookup(key string) (*Issue, reply, bool) {
	is, ok := s.byKey[strings.ToUpper(strings.TrimSpace(key))]
	if !ok {
		return nil, errReply(http.StatusNotFound, "Issue does not exist or you do not have permission to see it."), false
	}
	return is, reply{}, true
}

func (s *Server) getIssue(r *http.Request, key string) reply {
	is, rep, ok := s.lookup(key)
	if !ok {
		return rep
	}
	q := r.URL.Query()
	var fields []string
	if v := q.Get("fields"); v != "" {
		fields = strings.Split(v, ",")
	}
	expandChangelog := slices.Contains(strings.Split(q.Get("expand"), ","), "changelog")
	return jsonReply(http.StatusOK, s.render(r.Host, is, fields, expandChangelog))
}

// render builds the REST shape of an issue. fields nil means every field.
func (s *Server) render(host string, is *Issue, fields []string, withChangelog bool) map[string]any {
	all := map[string]any{}
	for k, v := range is.Fields {
		all[k] = v
	}
	labels := slices.Clone(is.Labels)
	if labels == nil {
		labels = []string{}
	}
	all["summary"] = is.Summary
	all["status"] = jira.Status{Name: is.Status}
	all["labels"] = labels
	all["updated"] = jira.Time{Time: is.Updated}
	all["created"] = jira.Time{Time: is.Created}
	named := func(names []string) []jira.Named {
		out := make([]jira.Named, 0, len(names))
		for _, n := range names {
			out = append(out, jira.Named{Name: n})
		}
		return out
	}
	all["components"] = named(is.Components)
	all["fixVersions"] = named(is.FixVersions)

	keep := fieldFilter(fields)
	out := map[string]any{}
	for k, v := range all {
		if keep(k) {
			out[k] = v
		}
	}
	obj := map[string]any{
		"id":     is.ID,
		"key":    is.Key,
		"self":   "http://" + host + "/rest/api/2/issue/" + is.ID,
		"fields": out,
	}
	if withChangelog {
		h := slices.Clone(is.Changelog)
		if h == nil {
			h = []jira.ChangelogEntry{}
		}
		obj["changelog"] = map[string]any{"startAt": 0, "maxResults": len(h), "total": len(h), "histories": h}
	}
	return obj
}

// fieldFilter implements Jira's fields parameter: names, "*all", "*navigable", "-name".
func fieldFilter(fields []string) func(string) bool {
	if len(fields) == 0 {
		return func(string) bool { return true }
	}
	include, exclude, all := map[string]bool{}, map[string]bool{}, false
	for _, f := range fields {
		f = strings.TrimSpace(f)
		switch {
		case f == "*all" || f == "*navigable":
			all = true
		case strings.HasPrefix(f, "-"):
			exclude[f[1:]] = true
		default:
			include[f] = true
		}
	}
	return func(name string) bool { return !exclude[name] && (all || include[name]) }
}

func (s *Server) putIssue(r *http.Request, key string, body []byte) reply {
	is, rep, ok := s.lookup(key)
	if !ok {
		return rep
	}
	var req struct {
		Update map[string][]map[string]json.RawMessage `json:"update"`
		Fields map[string]json.RawMessage              `json:"fields"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return errReply(http.StatusBadRequest, "fakejira: bad issue update: "+err.Error())
	}
	labels := slices.Clone(is.Labels)
	w := Write{Method: r.Method, Path: r.URL.Path, Key: is.Key}
	for name := range req.Update {
		if name != "labels" {
			return errReply(http.StatusBadRequest, fmt.Sprintf("fakejira: field %q cannot be updated here (only labels)", name))
		}
	}
	for _, op := range req.Update["labels"] {
		for verb, raw := range op {
			switch verb {
			case "add", "remove":
				var l string
				if err := json.Unmarshal(raw, &l); err != nil || l == "" || strings.ContainsAny(l, " \t\r\n") {
					return errReply(http.StatusBadRequest, fmt.Sprintf("The label '%s' is invalid.", strings.Trim(string(raw), `"`)))
				}
				if verb == "add" {
					w.Add = append(w.Add, l)
					if !slices.Contains(labels, l) {
						labels = append(labels, l)
					}
				} else {
					w.Remove = append(w.Remove, l)
					labels = slices.DeleteFunc(labels, func(x string) bool { return x == l })
				}
			case "set":
				var set []string
				if err := json.Unmarshal(raw, &set); err != nil {
					return errReply(http.StatusBadRequest, "fakejira: labels set wants an array of strings")
				}
				w.Set, labels = set, slices.Clone(set)
			default:
				return errReply(http.StatusBadRequest, fmt.Sprintf("fakejira: unknown labels operation %q", verb))
			}
		}
	}
	other := map[string]json.RawMessage{}
	for name, raw := range req.Fields {
		switch name {
		case "labels":
			var set []string
			if err := json.Unmarshal(raw, &set); err != nil {
				return errReply(http.StatusBadRequest, "fakejira: fields.labels wants an array of strings")
			}
			w.Set, labels = set, slices.Clone(set)
		case "summary", "status", "updated", "created", "components", "fixVersions":
			return errReply(http.StatusBadRequest, fmt.Sprintf("fakejira: field %q cannot be set here", name))
		default:
			other[name] = raw
		}
	}

	now := s.opts.Clock()
	for name, raw := range other {
		if is.Fields == nil {
			is.Fields = map[string]any{}
		}
		is.Fields[name] = raw
		is.Updated = now
	}
	s.setLabels(r.Host, is, s.actingUser(r), labels, now)
	w.At = now
	s.logWrite(w)
	return reply{status: http.StatusNoContent}
}

func (s *Server) logWrite(w Write) {
	s.writes = append(s.writes, w)
	if len(s.writes) > maxLog {
		s.writes = slices.Delete(s.writes, 0, len(s.writes)-maxLog)
	}
}

type commentJSON struct {
	ID         string            `json:"id"`
	Body       string            `json:"body"`
	Author     jira.User         `json:"author"`
	Created    jira.Time         `json:"created"`
	Updated    jira.Time         `json:"updated"`
	Visibility map[string]string `json:"visibility,omitempty"`
}

func toCommentJSON(c Comment) commentJSON {
	out := commentJSON{ID: c.ID, Body: c.Body, Author: c.Author, Created: jira.Time{Time: c.Created}, Updated: jira.Time{Time: c.Created}}
	if c.Visibility != "" {
		out.Visibility = map[string]string{"type": "group", "value": c.Visibility}
	}
	return out
}

func (s *Server) addComment(r *http.Request, key string, body []byte) reply {
	is, rep, ok := s.lookup(key)
	if !ok {
		return rep
	}
	var req struct {
		Body       json.RawMessage `json:"body"`
		Visibility *struct {
			Type  string `json:"type"`
			Value string `json:"value"`
		} `json:"visibility"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return errReply(http.StatusBadRequest, "fakejira: bad comment: "+err.Error())
	}
	var text string
	if err := json.Unmarshal(req.Body, &text); err != nil {
		text = string(req.Body) // an ADF document (API v3): keep its JSON
	}
	if strings.TrimSpace(text) == "" || text == "null" {
		rep := jsonReply(http.StatusBadRequest, map[string]any{"errorMessages": []string{}, "errors": map[string]string{"comment": "Comment body can not be empty!"}})
		return rep
	}
	now := s.opts.Clock()
	c := Comment{ID: strconv.Itoa(s.nextID), Body: text, Author: s.actingUser(r), Created: now}
	s.nextID++
	if req.Visibility != nil {
		c.Visibility = req.Visibility.Value
	}
	is.Comments = append(is.Comments, c)
	is.Updated = now
	s.logWrite(Write{Method: r.Method, Path: r.URL.Path, Key: is.Key, Comment: text, At: now})
	// Jira tells the webhooks of every comment, ymirflow's own included: the receiver
	// must recognise its own account's.
	s.queueComment(r.Host, is, c, now)
	return jsonReply(http.StatusCreated, toCommentJSON(c))
}

func (s *Server) listComments(key string) reply {
	is, rep, ok := s.lookup(key)
	if !ok {
		return rep
	}
	out := make([]commentJSON, 0, len(is.Comments))
	for _, c := range is.Comments {
		out = append(out, toCommentJSON(c))
	}
	return jsonReply(http.StatusOK, map[string]any{"startAt": 0, "maxResults": len(out), "total": len(out), "comments": out})
}

func (s *Server) changelog(r *http.Request, key string) reply {
	is, rep, ok := s.lookup(key)
	if !ok {
		return rep
	}
	q := r.URL.Query()
	start, size := 0, 100
	if v := q.Get("startAt"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return errReply(http.StatusBadRequest, "startAt must be a non-negative number")
		}
		start = n
	}
	if v := q.Get("maxResults"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return errReply(http.StatusBadRequest, "maxResults must be a number")
		}
		if n > 0 {
			size = n
		}
	}
	size = min(size, s.opts.MaxPageSize)
	start = min(start, len(is.Changelog))
	end := min(start+size, len(is.Changelog))
	values := slices.Clone(is.Changelog[start:end])
	if values == nil {
		values = []jira.ChangelogEntry{}
	}
	return jsonReply(http.StatusOK, map[string]any{
		"self":       "http://" + r.Host + r.URL.Path,
		"startAt":    start,
		"maxResults": size,
		"total":      len(is.Changelog),
		"isLast":     end >= len(is.Changelog),
		"values":     values,
	})
}

// userParam returns the user named by accountId, username or key, and which parameter named it.
func userParam(r *http.Request) (string, string) {
	q := r.URL.Query()
	for _, p := range []string{"accountId", "username", "key"} {
		if v := q.Get(p); v != "" {
			return v, p
		}
	}
	return "", ""
}

func (s *Server) userGroups(r *http.Request) reply {
	id, _ := userParam(r)
	if id == "" {
		return errReply(http.StatusBadRequest, "accountId, username or key is required")
	}
	groups, ok := s.groups[id]
	if !ok {
		return errReply(http.StatusNotFound, fmt.Sprintf("The user with account ID '%s' does not exist", id))
	}
	out := make([]map[string]string, 0, len(groups))
	for _, g := range groups {
		out = append(out, map[string]string{"name": g, "groupId": "fakejira-" + g})
	}
	return jsonReply(http.StatusOK, out)
}

func (s *Server) user(r *http.Request) reply {
	id, param := userParam(r)
	if id == "" {
		return errReply(http.StatusBadRequest, "accountId, username or key is required")
	}
	groups, ok := s.groups[id]
	if !ok {
		return errReply(http.StatusNotFound, fmt.Sprintf("The user named '%s' does not exist", id))
	}
	u := map[string]any{"displayName": id, "active": true}
	if param == "accountId" {
		u["accountId"] = id
	} else {
		u["name"], u["key"] = id, id
	}
	if slices.Contains(strings.Split(r.URL.Query().Get("expand"), ","), "groups") {
		items := make([]map[string]string, 0, len(groups))
		for _, g := range groups {
			items = append(items, map[string]string{"name": g})
		}
		u["groups"] = map[string]any{"size": len(items), "items": items}
	}
	return jsonReply(http.StatusOK, u)
}

// Now returns the server clock's time (handy for seeding relative timestamps).
func (s *Server) Now() time.Time { return s.opts.Clock() }

// rateLimited takes a token of Options.RateLimit's bucket, or answers 429 with the
// whole seconds until one is there in Retry-After. Runs with s.mu held.
func (s *Server) rateLimited() (reply, bool) {
	rl := s.opts.RateLimit
	if rl.N <= 0 {
		return reply{}, false
	}
	now := time.Now()
	if s.last.IsZero() {
		s.last = now
		if rl.StartEmpty {
			s.tokens = 0
		}
	}
	perToken := rl.Per.Seconds() / float64(rl.N)
	s.tokens = math.Min(float64(rl.Burst), s.tokens+now.Sub(s.last).Seconds()/perToken)
	s.last = now
	if s.tokens >= 1 {
		s.tokens--
		return reply{}, false
	}
	wait := int(math.Ceil((1 - s.tokens) * perToken))
	rep := errReply(http.StatusTooManyRequests, "Rate limit exceeded.")
	rep.header = http.Header{"Retry-After": {strconv.Itoa(max(wait, 1))}}
	return rep, true
}
