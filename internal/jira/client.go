// This client is hand-written on net/http rather than built on andygrunwald/go-jira: go-jira's
// tagged v1 only gained the /search/jql cursor endpoint as a late add-on (its v2 rewrite with the
// Cloud/on-premise split has no tagged release), and neither version has a rate limiter, retries on
// 429/5xx honouring Retry-After, or a fake server to test against. The handful of endpoints
// ymirflow uses fit in a few hundred lines of stdlib code whose every behaviour we test here.

package jira

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// API flavours, for Options.API.
const (
	APICloud  = "cloud"
	APIServer = "server"
)

// Defaults applied by New for zero Options fields.
const (
	DefaultTimeout        = 90 * time.Second
	DefaultMaxRetries     = 4
	DefaultRateLimit      = 5.0
	DefaultRetryBaseDelay = time.Second
	DefaultMaxRetryDelay  = 30 * time.Second
	DefaultMaxRetryAfter  = 5 * time.Minute
	DefaultPageSize       = 100
)

// maxResponseBody bounds how much of a response is read.
const maxResponseBody = 64 << 20

// Options configures a Client. New's errors name the field at fault; each field states
// its default.
type Options struct {
	// BaseURL is the Jira root, e.g. https://example.atlassian.net or
	// https://jira.example.com/jira, without credentials, query or fragment. Default (empty):
	// no Jira: writes are logged, reads fail with ErrNotConfigured.
	BaseURL string
	// Email selects Basic auth (email + API token, Jira Cloud). Default (empty): the token is
	// sent as a Bearer personal access token (Jira Server/DC).
	Email string
	// Token is the API token or PAT, surrounding whitespace trimmed; required with a
	// BaseURL. Reading it from a file is the caller's business.
	Token string
	// API is "cloud", "server", or "" for auto: cloud when the host ends with atlassian.net,
	// server otherwise. It picks the search endpoint, the changelog endpoint and how users
	// are named (accountId or username). Default: auto.
	API string
	// Timeout bounds one HTTP attempt. Default (0): DefaultTimeout, 90s; negative is refused.
	Timeout time.Duration
	// MaxRetries is how many times a request is retried after a 429, a 5xx or a network
	// error. Default (0): DefaultMaxRetries, 4; a negative value disables retries.
	MaxRetries int
	// RetryBaseDelay is the first backoff delay (doubling per retry, with jitter, capped at
	// MaxRetryDelay); defaults 1 s and 30 s. A Retry-After answer is honoured instead, unless it
	// exceeds MaxRetryAfter (default 5 min), in which case the error is returned at once.
	RetryBaseDelay time.Duration
	MaxRetryDelay  time.Duration
	MaxRetryAfter  time.Duration
	// RateLimit caps requests per second over the whole Client (all attempts, all
	// methods). Default (0): DefaultRateLimit, 5; a negative value disables the limit; NaN
	// and infinities are refused.
	RateLimit float64
	// RateBurst is how many requests an idle Client sends at once before RateLimit paces
	// the rest: one webhook delivery's few calls then go without waiting, and the rate
	// over any second stays within RateLimit plus the burst. Default (0): one second's
	// worth, RateLimit rounded up, at least 1; negative is refused.
	RateBurst int
	// Shared is a rate limit shared with the other processes of the pipeline
	// (internal/ratelimit's Budget, JIRA_RATE): every attempt waits for its permit
	// after RateLimit's, and a 429 pauses it for everyone, for the answer's
	// Retry-After (else for the backoff delay). Default: nil, none.
	Shared SharedLimit
	// PageSize is the maxResults SearchAll and Changelog ask for; default 100.
	PageSize int
	// CommentGroup, when set, restricts comments to that group (e.g. "Red Hat Employee").
	CommentGroup string
	// HTTPClient defaults to a fresh http.Client; timeouts come from Timeout either way.
	HTTPClient *http.Client
	// Logger receives structured logs; the zero Logger logs nothing.
	Logger zerolog.Logger
	// DryRun logs writes (labels, comments) instead of sending them. Reads are sent.
	// Default: false (true without a BaseURL).
	DryRun bool
	// UserAgent defaults to "ymirflow".
	UserAgent string
}

// SharedLimit is a rate limit that other processes share (internal/ratelimit's Budget).
type SharedLimit interface {
	// Wait blocks until a request may be sent, or ctx ends.
	Wait(ctx context.Context) error
	// Throttle pauses the limit for everyone for retryAfter.
	Throttle(ctx context.Context, retryAfter time.Duration) error
}

// Client is a Jira REST client. Build it with New; it is safe for concurrent use.
type Client struct {
	base          string // scheme://host/path without trailing slash; "" when offline
	api           string
	auth          string // Authorization header value
	userAgent     string
	timeout       time.Duration
	maxRetries    int
	baseDelay     time.Duration
	maxDelay      time.Duration
	maxRetryAfter time.Duration
	pageSize      int
	commentGroup  string
	dryRun        bool
	hc            *http.Client
	log           zerolog.Logger
	limit         *limiter
	shared        SharedLimit
}

// New validates opts and returns a Client. Errors name the field at fault, e.g.
// "jira: BaseURL: scheme must be http or https".
func New(opts Options) (*Client, error) {
	c := &Client{
		userAgent:     opts.UserAgent,
		timeout:       opts.Timeout,
		maxRetries:    opts.MaxRetries,
		baseDelay:     opts.RetryBaseDelay,
		maxDelay:      opts.MaxRetryDelay,
		maxRetryAfter: opts.MaxRetryAfter,
		pageSize:      opts.PageSize,
		commentGroup:  opts.CommentGroup,
		dryRun:        opts.DryRun,
		hc:            opts.HTTPClient,
		shared:        opts.Shared,
		log:           opts.Logger.With().Str("component", "jira").Logger(),
	}
	if c.userAgent == "" {
		c.userAgent = "ymirflow"
	}

	host, err := c.setBase(opts.BaseURL)
	if err != nil {
		return nil, err
	}
	if c.api, err = apiFlavour(opts.API, host); err != nil {
		return nil, err
	}
	token := strings.TrimSpace(opts.Token)
	if c.base != "" && token == "" {
		return nil, ErrTokenRequired
	}
	if email := strings.TrimSpace(opts.Email); email != "" {
		c.auth = "Basic " + base64.StdEncoding.EncodeToString([]byte(email+":"+token))
	} else if token != "" {
		c.auth = "Bearer " + token
	}

	if err := c.setRetries(); err != nil {
		return nil, err
	}
	if err := c.setLimits(opts); err != nil {
		return nil, err
	}
	hc := &http.Client{}
	if c.hc != nil {
		copied := *c.hc
		hc = &copied
	}
	hc.CheckRedirect = sameOriginOnly
	c.hc = hc
	return c, nil
}

// setBase sets c's base URL from raw (none, and dry run, when raw is blank) and returns
// its lower-case host name.
func (c *Client) setBase(raw string) (string, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		c.dryRun = true
		return "", nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("jira: BaseURL: not a URL: %w", redactURLError(err))
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("jira: BaseURL: scheme must be http or https, got %q", u.Scheme)
	case u.Host == "":
		return "", fmt.Errorf("jira: BaseURL: no host in %q", u.Redacted())
	case u.User != nil:
		return "", fmt.Errorf("jira: BaseURL: must not carry credentials (%s); use Email and Token", u.Redacted())
	case u.RawQuery != "" || u.Fragment != "":
		return "", fmt.Errorf("jira: BaseURL: must not have a query or fragment: %q", u.Redacted())
	}
	c.base = u.Scheme + "://" + u.Host + strings.TrimRight(u.EscapedPath(), "/")
	return strings.ToLower(u.Hostname()), nil
}

// apiFlavour is Options.API as a flavour; empty (auto) is APICloud on an
// *.atlassian.net host, else APIServer.
func apiFlavour(api, host string) (string, error) {
	switch strings.ToLower(strings.TrimSpace(api)) {
	case "":
		if host == "atlassian.net" || strings.HasSuffix(host, ".atlassian.net") {
			return APICloud, nil
		}
		return APIServer, nil
	case APICloud:
		return APICloud, nil
	case APIServer, "dc", "datacenter":
		return APIServer, nil
	}
	return "", fmt.Errorf("jira: API: must be %q, %q or empty (auto), got %q", APICloud, APIServer, api)
}

// setRetries checks the timeout and the retry settings, and sets their defaults.
func (c *Client) setRetries() error {
	switch {
	case c.timeout < 0:
		return fmt.Errorf("jira: Timeout: must not be negative, got %s", c.timeout)
	case c.timeout == 0:
		c.timeout = DefaultTimeout
	}
	switch {
	case c.maxRetries < 0:
		c.maxRetries = 0
	case c.maxRetries == 0:
		c.maxRetries = DefaultMaxRetries
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"RetryBaseDelay", &c.baseDelay, DefaultRetryBaseDelay},
		{"MaxRetryDelay", &c.maxDelay, DefaultMaxRetryDelay},
		{"MaxRetryAfter", &c.maxRetryAfter, DefaultMaxRetryAfter},
	} {
		if *d.v < 0 {
			return fmt.Errorf("jira: %s: must not be negative, got %s", d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if c.maxDelay < c.baseDelay {
		c.maxDelay = c.baseDelay
	}
	return nil
}

// setLimits checks the rate limit and the page size, and sets their defaults.
func (c *Client) setLimits(opts Options) error {
	rate := opts.RateLimit
	switch {
	case math.IsNaN(rate) || math.IsInf(rate, 0):
		return fmt.Errorf("jira: RateLimit: must be a finite number, got %v", rate)
	case rate == 0:
		rate = DefaultRateLimit
	}
	switch {
	case opts.RateBurst < 0:
		return fmt.Errorf("jira: RateBurst: must not be negative, got %d", opts.RateBurst)
	case rate > 0:
		burst := opts.RateBurst
		if burst == 0 {
			burst = max(1, int(math.Ceil(rate)))
		}
		c.limit = &limiter{interval: time.Duration(float64(time.Second) / rate), burst: burst}
	}
	switch {
	case c.pageSize < 0:
		return fmt.Errorf("jira: PageSize: must not be negative, got %d", c.pageSize)
	case c.pageSize == 0:
		c.pageSize = DefaultPageSize
	}
	return nil
}

// API returns the API flavour in use: APICloud or APIServer.
func (c *Client) API() string { return c.api }

// DryRun reports whether writes are logged instead of sent.
func (c *Client) DryRun() bool { return c.dryRun }

// request is one logical call; do sends it, with retries.
type request struct {
	method   string
	path     string // unescaped API path for logs and errors
	rawPath  string // escaped path sent on the wire
	query    url.Values
	body     any
	issueKey string
	// idempotent requests are retried on any 5xx and on network errors; others only on 429
	// and 503, which promise the request was not processed.
	idempotent bool
}

// do sends r, retrying per the Client's policy, and decodes a 2xx JSON body into out (if not nil).
func (c *Client) do(ctx context.Context, r request, out any) error {
	if c.base == "" {
		return ErrNotConfigured
	}
	u, payload, err := c.prepare(r)
	if err != nil {
		return err
	}
	log := c.log.With().Str("method", r.method).Str("path", r.path).Logger()
	if r.issueKey != "" {
		log = log.With().Str("issue_key", r.issueKey).Logger()
	}

	for attempt := 1; ; attempt++ {
		if err := c.waitLimits(ctx, r); err != nil {
			return err
		}
		res := c.attempt(ctx, r, u, payload, out, log, attempt)
		if res.done || !res.retry || attempt > c.maxRetries {
			return res.err
		}
		delay := c.backoff(attempt)
		if res.hasRetryAfter {
			if res.retryAfter > c.maxRetryAfter {
				return fmt.Errorf("%w (Retry-After %s exceeds the %s limit; not retried)", res.err, res.retryAfter, c.maxRetryAfter)
			}
			delay = res.retryAfter
		}
		log.Warn().Err(res.err).Int("attempt", attempt).Dur("retry_in", delay).Msg("jira request will be retried")
		if serr := sleepCtx(ctx, delay); serr != nil {
			return fmt.Errorf("%w (retry abandoned: %w)", res.err, serr)
		}
	}
}

// prepare returns the URL and the encoded body of r.
func (c *Client) prepare(r request) (u string, payload []byte, err error) {
	if r.rawPath == "" {
		r.rawPath = r.path
	}
	if r.body != nil {
		b, err := json.Marshal(r.body)
		if err != nil {
			return "", nil, fmt.Errorf("jira: encode %s %s: %w", r.method, r.path, err)
		}
		payload = b
	}
	u = c.base + r.rawPath
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	return u, payload, nil
}

// waitLimits waits for this process's rate limiter, then for the shared one (if any).
func (c *Client) waitLimits(ctx context.Context, r request) error {
	if err := c.limit.wait(ctx); err != nil {
		return fmt.Errorf("jira: %s %s: waiting for the rate limiter: %w", r.method, r.path, err)
	}
	if c.shared != nil {
		if err := c.shared.Wait(ctx); err != nil {
			return fmt.Errorf("jira: %s %s: waiting for the shared rate limit: %w", r.method, r.path, err)
		}
	}
	return nil
}

// attemptResult is how one attempt of a request ended.
type attemptResult struct {
	err error
	// done: the request is over whatever the retry policy says (a 2xx, decoded or
	// not, or the caller's context ended); err is its result.
	done bool
	// retry: the policy allows another attempt, after retryAfter if the answer had one.
	retry         bool
	retryAfter    time.Duration
	hasRetryAfter bool
}

// attempt sends r once (attempt is its number) and decodes a 2xx body into out.
func (c *Client) attempt(ctx context.Context, r request, u string, payload []byte, out any, log zerolog.Logger, attempt int) attemptResult {
	start := time.Now()
	status, hdr, body, err := c.send(ctx, r.method, u, payload)
	took := time.Since(start)

	switch {
	case err != nil:
		if ctx.Err() != nil {
			return attemptResult{err: fmt.Errorf("jira: %s %s: %w", r.method, r.path, context.Cause(ctx)), done: true}
		}
		err = fmt.Errorf("jira: %s %s: %w", r.method, r.path, err)
		log.Debug().Err(err).Int("attempt", attempt).Dur("took", took).Msg("jira request failed")
		return attemptResult{err: err, retry: r.idempotent && !errors.Is(err, ErrRedirect)}
	case status >= 200 && status < 300:
		log.Debug().Int("status", status).Int("attempt", attempt).Dur("took", took).Msg("jira request")
		if out == nil || len(bytes.TrimSpace(body)) == 0 {
			return attemptResult{done: true}
		}
		if err := json.Unmarshal(body, out); err != nil {
			return attemptResult{err: fmt.Errorf("jira: %s %s: decode response: %w", r.method, r.path, err), done: true}
		}
		return attemptResult{done: true}
	}
	he := newHTTPError(r.method, r.path, status, body)
	he.Attempts = attempt
	res := attemptResult{err: he, retry: status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable ||
		(r.idempotent && status >= 500)}
	res.retryAfter, res.hasRetryAfter = parseRetryAfter(hdr.Get("Retry-After"), time.Now())
	if status == http.StatusTooManyRequests {
		c.throttle(ctx, log, res.retryAfter, res.hasRetryAfter, attempt)
	}
	log.Debug().Int("status", status).Int("attempt", attempt).Dur("took", took).Msg("jira request")
	return res
}

// throttle pauses the shared limit for every process after a 429: for its Retry-After,
// else for this attempt's backoff delay. A failure to pause is logged: the request's own
// retry still waits.
func (c *Client) throttle(ctx context.Context, log zerolog.Logger, retryAfter time.Duration, hasRetryAfter bool, attempt int) {
	if c.shared == nil {
		return
	}
	if !hasRetryAfter {
		retryAfter = c.backoff(attempt)
	}
	if err := c.shared.Throttle(ctx, retryAfter); err != nil {
		log.Warn().Err(err).Dur("retry_after", retryAfter).Msg("jira answered 429; pausing the shared rate limit failed")
	}
}

// send performs one HTTP attempt and reads the whole (bounded) body.
func (c *Client) send(ctx context.Context, method, u string, payload []byte) (int, http.Header, []byte, error) {
	actx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var rd io.Reader
	if payload != nil {
		rd = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(actx, method, u, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.userAgent)
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.auth != "" {
		req.Header.Set("Authorization", c.auth)
	}
	// Jira rejects writes without this header when XSRF protection sees a browser-like request.
	req.Header.Set("X-Atlassian-Token", "no-check")
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody))
	if err != nil {
		return 0, nil, nil, fmt.Errorf("read response: %w", err)
	}
	return resp.StatusCode, resp.Header, body, nil
}

// backoff returns the delay before retry number attempt (1-based): RetryBaseDelay doubled per
// attempt, capped at MaxRetryDelay, with "equal jitter" (a random value in [d/2, d]).
func (c *Client) backoff(attempt int) time.Duration {
	d := c.baseDelay
	for i := 1; i < attempt && d < c.maxDelay; i++ {
		d *= 2
	}
	if d > c.maxDelay {
		d = c.maxDelay
	}
	half := d / 2
	return half + time.Duration(rand.Int64N(int64(d-half)+1))
}

// parseRetryAfter reads a Retry-After header: delay-seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		if n > int64(math.MaxInt64/int64(time.Second)) {
			n = int64(math.MaxInt64 / int64(time.Second))
		}
		return time.Duration(n) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		d := t.Sub(now)
		if d < 0 {
			d = 0
		}
		return d, true
	}
	return 0, false
}

// errDeadlineTooSoon is returned instead of sleeping past the context's deadline.
var errDeadlineTooSoon = fmt.Errorf("the wait would outlast the context deadline: %w", context.DeadlineExceeded)

// sleepCtx sleeps for d, or returns early with the context's error. It does not start a sleep
// that would end after the context's deadline.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return errDeadlineTooSoon
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// limiter is a token bucket of burst tokens refilled one per interval, shared across
// goroutines: an idle Client sends burst requests at once, then one per interval.
// It keeps the time at which the bucket would be full again (GCRA), so a
// request costs one lock and no goroutine.
type limiter struct {
	mu       sync.Mutex
	interval time.Duration
	burst    int       // at least 1; 0 counts as 1
	full     time.Time // when the bucket is full again; the past: full now
}

// wait blocks until the caller's token. A nil limiter never waits.
func (l *limiter) wait(ctx context.Context) error {
	if l == nil {
		return ctx.Err()
	}
	now := time.Now()
	return sleepCtx(ctx, l.reserve(now))
}

// reserve takes a token at now and returns how long its holder must wait for it: zero
// while the bucket holds one.
func (l *limiter) reserve(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	full := l.full
	if full.Before(now) {
		full = now
	}
	l.full = full.Add(l.interval)
	// The token is there once the bucket lacks at most burst-1 of them.
	at := full.Add(-time.Duration(max(l.burst, 1)-1) * l.interval)
	if at.Before(now) {
		return 0
	}
	return at.Sub(now)
}

// redactURLError drops the URL (which may hold a password) from a url.Parse error.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// issuePath returns the unescaped and escaped forms of /rest/api/2/issue/{key}{suffix}.
func issuePath(key, suffix string) (string, string) {
	return "/rest/api/2/issue/" + key + suffix, "/rest/api/2/issue/" + url.PathEscape(key) + suffix
}

// sameOriginOnly is the client's redirect policy: a redirect is followed only to the same
// scheme, host and port. net/http would forward the Authorization header set on the
// request to the same host on another port or scheme (https → http: the token in clear)
// and to subdomains; Jira's API has no reason to redirect anywhere else.
func sameOriginOnly(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("jira: stopped after 10 redirects")
	}
	first := via[0].URL
	if req.URL.Scheme != first.Scheme || !strings.EqualFold(req.URL.Host, first.Host) {
		return fmt.Errorf("%w: %s://%s to %s://%s", ErrRedirect, first.Scheme, first.Host, req.URL.Scheme, req.URL.Host)
	}
	return nil
}
