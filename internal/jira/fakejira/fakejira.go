// Package fakejira is an in-memory Jira HTTP server for tests and the demo. It speaks the subset
// of the Jira REST API that package jira uses, on both /rest/api/2 and /rest/api/3:
//
//   - search: POST or GET /rest/api/3/search/jql (Cloud, nextPageToken) and POST or GET
//     /rest/api/2/search (Server/DC, startAt/total). Any JQL matches every issue, in seed order;
//     pages honour maxResults (capped by Options.MaxPageSize).
//   - GET /rest/api/2/issue/{key} (fields=, expand=changelog), PUT /rest/api/2/issue/{key} with
//     {"update":{"labels":[{"add":…},{"remove":…},{"set":[…]}]}} or {"fields":{"labels":[…]}}
//     (records a changelog entry by Options.CurrentUser at the clock's time and bumps updated),
//     POST /rest/api/2/issue/{key}/comment, GET /rest/api/2/issue/{key}/changelog (paged).
//   - GET /rest/api/2/user/groups?accountId=|username=, GET /rest/api/2/user?…&expand=groups
//     (from Options.Groups), GET /rest/api/2/myself.
//   - POST /rest/api/2/issue {"fields":{"project":{"key":…},"summary":…,"labels":[…]}} creates
//     an issue with the project's next number.
//   - webhooks: every label change and every issue created (POST, or CreateIssue) is POSTed to
//     Options.Webhooks, signed, shaped as Jira's (webhookEvent, issue, user, changelog), with
//     retries. A PUT with the header X-Fakejira-User: <accountId> acts as that user, as a
//     maintainer editing the issue in Jira's UI would (changelog author, webhook user).
//
// Tests seed it with Go values (Issue) or a JSON file (LoadFile), inject failures with FailNext,
// and inspect what clients did with Writes, Requests, Labels and Comments. A Server is an
// http.Handler, so `ymirflow fakejira --addr` can serve it with net/http; Start serves it on a
// loopback port for tests. All state is guarded by one mutex.
package fakejira

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ymirflow/ymirflow/internal/httpsrv"
	"github.com/ymirflow/ymirflow/internal/jira"
)

// Defaults for Options.
const (
	DefaultPageSize    = 50
	DefaultMaxPageSize = 100
	// maxLog bounds the Requests and Writes logs (oldest entries are dropped).
	maxLog = 100_000
)

// DefaultUser is the current user when Options.CurrentUser is empty.
var DefaultUser = jira.User{AccountID: "fakejira-bot", Name: "fakejira-bot", DisplayName: "ymirflow bot"}

// Options configures a Server.
type Options struct {
	// Issues seed the server, in search order.
	Issues []Issue
	// CurrentUser is the author of changes made through the API and the answer to /myself.
	CurrentUser jira.User
	// Groups maps a user (accountId or username) to the names of its groups. Users not in the
	// map are unknown (404) to the user endpoints.
	Groups map[string][]string
	// Token, when set, is required: Basic auth with Email and Token when Email is set, else a
	// Bearer Token. Anything else is answered 401. Empty Token: no authentication.
	Email string
	Token string
	// Clock gives the time of changes; default time.Now.
	Clock func() time.Time
	// DefaultPageSize (default 50) is used when a request has no maxResults; MaxPageSize
	// (default 100) caps maxResults.
	DefaultPageSize int
	MaxPageSize     int
	// Limits bound the connections of the server Start and Listen run (zero: httpsrv's
	// defaults).
	Limits httpsrv.Limits
	// Webhooks receive a signed Jira-shaped delivery on every label change and issue
	// creation (see webhook.go); WebhookRetries (default 3) retries a failed delivery, after
	// WebhookRetryDelay (default 100ms), doubled each time.
	Webhooks          []WebhookTarget
	WebhookRetries    int
	WebhookRetryDelay time.Duration
	// RateLimit, when its N is set, makes the server answer 429 with Retry-After (whole
	// seconds until the next request would pass) to requests beyond it, as Jira Cloud
	// does: a token bucket of Burst requests refilled N per Per on the wall clock. Those
	// answers change nothing and are logged in Requests with their status.
	RateLimit RateLimit
}

// RateLimit is Options.RateLimit.
type RateLimit struct {
	N     int
	Per   time.Duration // default: a second
	Burst int           // default: N
	// StartEmpty: the bucket is empty when the first request comes, as if another client
	// had just spent it: the first request is answered 429.
	StartEmpty bool
}

// Issue is the Go-side description of a seeded issue.
type Issue struct {
	Key         string
	ID          string // default: assigned from 10000 upwards
	Summary     string
	Status      string // default "New"
	Labels      []string
	Updated     time.Time
	Created     time.Time
	Components  []string
	FixVersions []string
	// Fields holds any other field, served as is (e.g. "customfield_10669": "perl:5.32/perl",
	// or json.RawMessage values as loaded from a file).
	Fields    map[string]any
	Changelog []jira.ChangelogEntry
	Comments  []Comment
}

// Comment is one comment on an issue.
type Comment struct {
	ID      string
	Body    string
	Author  jira.User
	Created time.Time
	// Visibility is the group the comment is restricted to; "" when public.
	Visibility string
}

// Write is one successful write made through the API.
type Write struct {
	Method  string
	Path    string
	Key     string
	Add     []string // labels added (as requested)
	Remove  []string // labels removed (as requested)
	Set     []string // labels set wholesale, when the request did that
	Comment string   // the comment body, for comment writes
	At      time.Time
}

// Request is one request the server received.
type Request struct {
	Method        string
	Path          string
	RawQuery      string
	Authorization string
	Status        int
	At            time.Time
}

type fault struct {
	n          int
	status     int
	retryAfter string
}

// Server is the fake Jira. Build it with New.
type Server struct {
	opts Options

	mu       sync.Mutex
	issues   []*Issue
	byKey    map[string]*Issue
	groups   map[string][]string
	faults   []fault
	writes   []Write
	requests []Request
	nextID   int

	hooks hookState
	// The RateLimit's bucket: tokens left at last.
	tokens float64
	last   time.Time

	lnMu sync.Mutex
	hs   *http.Server
	url  string
}

// New returns a Server seeded from opts. It serves nothing until Start or Listen, or until it
// is mounted as an http.Handler.
func New(opts Options) *Server {
	if opts.CurrentUser == (jira.User{}) {
		opts.CurrentUser = DefaultUser
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.DefaultPageSize <= 0 {
		opts.DefaultPageSize = DefaultPageSize
	}
	if opts.MaxPageSize <= 0 {
		opts.MaxPageSize = DefaultMaxPageSize
	}
	if opts.WebhookRetries == 0 {
		opts.WebhookRetries = DefaultWebhookRetries
	}
	if opts.WebhookRetryDelay <= 0 {
		opts.WebhookRetryDelay = DefaultWebhookRetryDelay
	}
	if opts.RateLimit.N > 0 {
		if opts.RateLimit.Per <= 0 {
			opts.RateLimit.Per = time.Second
		}
		if opts.RateLimit.Burst <= 0 {
			opts.RateLimit.Burst = opts.RateLimit.N
		}
	}
	s := &Server{opts: opts, byKey: map[string]*Issue{}, groups: map[string][]string{}, nextID: 10000}
	s.tokens = float64(opts.RateLimit.Burst)
	s.hooks.client = &http.Client{Timeout: 5 * time.Second}
	for u, g := range opts.Groups {
		s.groups[u] = slices.Clone(g)
	}
	s.AddIssues(opts.Issues...)
	return s
}

// Start serves on a free loopback port and returns the base URL (httptest style); it panics if
// no port can be had. Calling it again returns the same URL.
func (s *Server) Start() string {
	u, err := s.Listen("127.0.0.1:0")
	if err != nil {
		panic(fmt.Sprintf("fakejira: start: %v", err))
	}
	return u
}

// Listen serves on addr (e.g. ":8080") in the background and returns the base URL.
func (s *Server) Listen(addr string) (string, error) {
	s.lnMu.Lock()
	defer s.lnMu.Unlock()
	if s.hs != nil {
		return s.url, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("fakejira: listen on %s: %w", addr, err)
	}
	s.hs = httpsrv.New(s, s.opts.Limits)
	host := ln.Addr().String()
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		host = net.JoinHostPort("127.0.0.1", strconv.Itoa(tcp.Port))
	}
	s.url = "http://" + host
	go func(hs *http.Server) { _ = hs.Serve(ln) }(s.hs)
	return s.url, nil
}

// URL returns the base URL after Start or Listen, else "".
func (s *Server) URL() string {
	s.lnMu.Lock()
	defer s.lnMu.Unlock()
	return s.url
}

// Close stops serving (if Start or Listen was called), dropping open connections. State stays
// readable.
func (s *Server) Close() {
	s.lnMu.Lock()
	hs := s.hs
	s.hs = nil
	s.lnMu.Unlock()
	if hs == nil {
		return
	}
	// Close, not Shutdown: Shutdown waits up to 5 s for connections a client dialed but never
	// used, which would slow every test down. Handlers only touch state under the mutex.
	_ = hs.Close()
}

// AddIssues adds issues (or replaces those with the same key, keeping their position).
func (s *Server) AddIssues(issues ...Issue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, is := range issues {
		c := cloneIssue(is)
		c.Key = strings.TrimSpace(c.Key)
		if c.ID == "" {
			c.ID = strconv.Itoa(s.nextID)
			s.nextID++
		}
		if c.Status == "" {
			c.Status = "New"
		}
		k := strings.ToUpper(c.Key)
		if old, ok := s.byKey[k]; ok {
			*old = c
			continue
		}
		p := &c
		s.issues = append(s.issues, p)
		s.byKey[k] = p
	}
}

// Issue returns a copy of the issue's current state.
func (s *Server) Issue(key string) (Issue, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	is, ok := s.byKey[strings.ToUpper(strings.TrimSpace(key))]
	if !ok {
		return Issue{}, false
	}
	return cloneIssue(*is), true
}

// Labels returns the issue's current labels (nil for an unknown key).
func (s *Server) Labels(key string) []string {
	is, ok := s.Issue(key)
	if !ok {
		return nil
	}
	return is.Labels
}

// Comments returns the issue's comments, oldest first.
func (s *Server) Comments(key string) []Comment {
	is, ok := s.Issue(key)
	if !ok {
		return nil
	}
	return is.Comments
}

// SetGroups sets the groups of user (an accountId or username).
func (s *Server) SetGroups(user string, groups ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.groups[user] = slices.Clone(groups)
}

// FailNext makes the next n requests (after any failures already queued) fail with status,
// with a Retry-After header when retryAfter is not empty. Failed requests change nothing.
func (s *Server) FailNext(n, status int, retryAfter string) {
	if n <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, fault{n: n, status: status, retryAfter: retryAfter})
}

// Writes returns the successful writes made through the API, oldest first.
func (s *Server) Writes() []Write {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Write, len(s.writes))
	for i, w := range s.writes {
		w.Add, w.Remove, w.Set = slices.Clone(w.Add), slices.Clone(w.Remove), slices.Clone(w.Set)
		out[i] = w
	}
	return out
}

// Requests returns every request received, oldest first, with the status it got.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// LoadFile reads a JSON file of issues shaped as Jira's REST API returns them: an array
// [{"key":…, "fields":{"labels":[…], "updated":…, "status":{"name":…}, …}}, …] or a search
// response {"issues":[…]}. A "changelog":{"histories":[…]} member (as with expand=changelog)
// seeds the changelog.
func LoadFile(path string) ([]Issue, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("fakejira: %w", err)
	}
	issues, err := ParseIssues(b)
	if err != nil {
		return nil, fmt.Errorf("fakejira: %s: %w", path, err)
	}
	return issues, nil
}

// ParseIssues is LoadFile on bytes.
func ParseIssues(b []byte) ([]Issue, error) {
	var list []json.RawMessage
	if err := json.Unmarshal(b, &list); err != nil {
		var wrapped struct {
			Issues []json.RawMessage `json:"issues"`
		}
		if err2 := json.Unmarshal(b, &wrapped); err2 != nil || wrapped.Issues == nil {
			return nil, fmt.Errorf("want a JSON array of issues or {\"issues\":[…]}: %w", err)
		}
		list = wrapped.Issues
	}
	out := make([]Issue, 0, len(list))
	for i, raw := range list {
		var ji jira.Issue
		if err := json.Unmarshal(raw, &ji); err != nil {
			return nil, fmt.Errorf("issue %d: %w", i, err)
		}
		if strings.TrimSpace(ji.Key) == "" {
			return nil, fmt.Errorf("issue %d: no key", i)
		}
		is := FromJira(ji)[0]
		var cl struct {
			Changelog struct {
				Histories []jira.ChangelogEntry `json:"histories"`
			} `json:"changelog"`
		}
		if err := json.Unmarshal(raw, &cl); err != nil {
			return nil, fmt.Errorf("issue %s: changelog: %w", ji.Key, err)
		}
		is.Changelog = cl.Changelog.Histories
		out = append(out, is)
	}
	return out, nil
}

// FromJira converts issues as the jira package decodes them into seed Issues. Fields other than
// the typed ones are kept as raw JSON.
func FromJira(issues ...jira.Issue) []Issue {
	out := make([]Issue, 0, len(issues))
	for _, ji := range issues {
		f := ji.Fields
		is := Issue{
			Key: ji.Key, ID: ji.ID, Summary: f.Summary, Status: f.Status.Name,
			Labels: slices.Clone(f.Labels), Updated: f.Updated.Time, Created: f.Created.Time,
		}
		for _, c := range f.Components {
			is.Components = append(is.Components, c.Name)
		}
		for _, v := range f.FixVersions {
			is.FixVersions = append(is.FixVersions, v.Name)
		}
		for k, v := range f.Raw {
			if isTypedField(k) {
				continue
			}
			if is.Fields == nil {
				is.Fields = map[string]any{}
			}
			is.Fields[k] = v
		}
		out = append(out, is)
	}
	return out
}

func isTypedField(name string) bool {
	switch name {
	case "summary", "status", "labels", "updated", "created", "components", "fixVersions":
		return true
	}
	return false
}

func cloneIssue(is Issue) Issue {
	c := is
	c.Labels = slices.Clone(is.Labels)
	c.Components = slices.Clone(is.Components)
	c.FixVersions = slices.Clone(is.FixVersions)
	if is.Fields != nil {
		c.Fields = make(map[string]any, len(is.Fields))
		for k, v := range is.Fields {
			c.Fields[k] = v
		}
	}
	c.Changelog = make([]jira.ChangelogEntry, len(is.Changelog))
	for i, e := range is.Changelog {
		e.Items = slices.Clone(e.Items)
		c.Changelog[i] = e
	}
	if is.Changelog == nil {
		c.Changelog = nil
	}
	c.Comments = slices.Clone(is.Comments)
	return c
}

// encodeToken and decodeToken make the opaque Cloud search cursor.
func encodeToken(offset int) string {
	return base64.RawURLEncoding.EncodeToString([]byte("fakejira:" + strconv.Itoa(offset)))
}

func decodeToken(tok string) (int, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return 0, errors.New("invalid nextPageToken")
	}
	rest, ok := strings.CutPrefix(string(b), "fakejira:")
	if !ok {
		return 0, errors.New("invalid nextPageToken")
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 {
		return 0, errors.New("invalid nextPageToken")
	}
	return n, nil
}
