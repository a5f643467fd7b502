package web_test

import (
	"encoding/json"
	"errors"
	"html"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

func TestPagesRenderEscapedRedactedAndWithCSP(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	e.publish("RHEL-5")
	id := e.bury("RHEL-5", `agent said <script>alert(1)</script> with `+secret)
	for _, p := range []string{"/", "/leases", "/pending", "/issue?key=%20rhel-5%20", "/dead-letters", "/dead-letters/" + id,
		"/api/v1/dead-letters", "/api/v1/dead-letters/" + id, "/api/v1/issues/rhel-5", "/api/v1/overview"} {
		code, body, h := e.do("GET", p, "", nil)
		if code != 200 {
			t.Fatalf("GET %s: %d %s", p, code, body)
		}
		if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "default-src 'none'") {
			t.Fatalf("GET %s: CSP %q", p, csp)
		}
		if strings.Contains(body, secret) {
			t.Fatalf("GET %s shows the secret", p)
		}
		if strings.Contains(body, "<script>alert") {
			t.Fatalf("GET %s: unescaped agent text", p)
		}
	}
	_, body := e.get("/dead-letters/" + id)
	if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt; with [redacted]") {
		t.Fatalf("dead letter detail does not show the escaped, redacted error:\n%s", body)
	}
	_, body = e.get("/issue?key=%20rhel-5%20")
	if !strings.Contains(body, "<h1>RHEL-5</h1>") || !strings.Contains(body, "triage.requested") {
		t.Fatalf("issue search with a sloppy key form:\n%s", body)
	}
	// The fragment a page refreshes itself with is the live part only.
	_, frag := e.get("/dead-letters?fragment=1")
	if strings.Contains(frag, "<html") || !strings.Contains(frag, `data-id="`+id+`"`) {
		t.Fatalf("fragment:\n%s", frag)
	}
}

// The dead-letter list shows the end of an agent's stderr, where it says why it failed,
// after what failed (issue 35): the head of a long stderr is progress lines.
func TestDeadLetterListShowsTheEndOfTheStderr(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	e.bury("RHEL-4", "exec runner: exit status 1; stderr: "+strings.Repeat("INFO cloning and building the package\n", 40)+
		"FATAL: patch 0003 does not apply")
	_, body := e.get("/dead-letters")
	if !strings.Contains(body, "exec runner: exit status 1; stderr: …") || !strings.Contains(body, "FATAL: patch 0003 does not apply</td>") {
		t.Fatalf("the list lacks the start and the end of the error:\n%s", body)
	}
}

// A bad issue key reads the same in the console as in the CLI: inspect.BadKey's
// sentence, never the lease's pattern (issue 35).
func TestBadKeysReadAsInTheCLI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	for _, key := range []string{"RHEL 1", "../x", strings.Repeat("A", 298) + "-1"} {
		for _, p := range []string{"/issue?key=" + url.QueryEscape(key), "/api/v1/issues/" + url.PathEscape(key),
			"/pending?issue=" + url.QueryEscape(key), "/api/v1/dead-letters?issue=" + url.QueryEscape(key)} {
			code, body, _ := e.do("GET", p, "", nil)
			want := html.EscapeString(inspect.BadKey(key)) // a page
			if strings.HasPrefix(p, "/api/") {
				want = strings.ReplaceAll(inspect.BadKey(key), `"`, `\"`) // a JSON string
			}
			if code != 400 || !strings.Contains(body, want) || strings.Contains(body, "does not match") {
				t.Errorf("GET %s: %d, want 400 saying %q:\n%.600s", p, code, want, body)
			}
		}
	}
}

// A stream nobody consumes says how many events wait for a worker, on the overview and
// the pending page (issue 35).
func TestStreamWithoutGroupSaysEventsWait(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	e.publish("RHEL-3")
	e.publish("RHEL-4")
	for _, p := range []string{"/", "/pending"} {
		if _, body := e.get(p); !strings.Contains(body, "2 events wait for a worker that does not exist") {
			t.Errorf("GET %s:\n%.3000s", p, body)
		}
	}
}

func TestBadInputIsA4xxNeverA500(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	long := strings.Repeat("a", 5000)
	for _, c := range []struct {
		method, path, body string
		code               int
		says               string
	}{
		{"GET", "/issue?key=not%20a%20key", "", 400, "issue key"},
		{"GET", "/issue?key=RHEL-404", "", 404, "no events of RHEL-404"},
		{"GET", "/issue?key=" + long, "", 414, "longer than"},
		{"GET", "/issue?key=" + strings.Repeat("A", 100), "", 400, "(100 characters) is not an issue key"},
		{"GET", "/dead-letters/abc", "", 400, "not a stream id"},
		{"GET", "/dead-letters/1-0", "", 404, "not found"},
		{"GET", "/leases/release?agent=nobody&issue=RHEL-1", "", 400, "unknown agent"},
		{"GET", "/leases/release?agent=triage&issue=RHEL-1", "", 404, "not found"},
		{"GET", "/pending?agent=x", "", 400, "unknown agent"},
		{"GET", "/api/v1/issues/%3Cb%3E", "", 400, "issue key"},
		{"GET", "/api/v1/outcomes?minutes=-1", "", 400, "minutes"},
		{"GET", "/api/v1/nope", "", 404, "no such API endpoint"},
		{"GET", "/nope", "", 404, "no such page"},
		{"POST", "/api/v1/dead-letters/requeue", `{"ids":`, 401, "Bearer"},
	} {
		code, body, _ := e.do(c.method, c.path, c.body, nil)
		if code != c.code || !strings.Contains(body, c.says) {
			t.Errorf("%s %.60s: %d, want %d saying %q:\n%.400s", c.method, c.path, code, c.code, c.says, body)
		}
	}
	auth := map[string]string{"Authorization": "Bearer " + token}
	for body, says := range map[string]string{`{"ids":`: "expected JSON", `{"ids":["x"]}`: "not a stream id", `{"ids":[]}`: "select at least one",
		`{"idz":["1-0"]}`: "unknown field", `{"ids":["1-0"]}` + strings.Repeat(" ", 70<<10): "larger than"} {
		code, out, _ := e.do("POST", "/api/v1/dead-letters/requeue", body, auth)
		if code < 400 || code > 499 || !strings.Contains(out, says) {
			t.Errorf("requeue %.30q: %d %s", body, code, out)
		}
	}
	// Requeueing ids no dead letter has is a 404 naming them, not a 200 that requeued
	// nothing (issue 35).
	code, out, _ := e.do("POST", "/api/v1/dead-letters/requeue", `{"ids":["1-0","2-0"],"reason":"retry"}`, auth)
	var apiErr struct {
		Error  string `json:"error"`
		Status int    `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &apiErr); err != nil || code != 404 || apiErr.Status != 404 ||
		!strings.Contains(apiErr.Error, "dead letter 1-0: not found") || !strings.Contains(apiErr.Error, "dead letter 2-0: not found") {
		t.Errorf("requeue of unknown ids: %d %s (%v)", code, out, err)
	}
}

func TestWritesNeedTheTokenAndCSRF(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	id := e.bury("RHEL-6", "boom")
	form := "application/x-www-form-urlencoded"
	// API: no token, a wrong one, another origin.
	for _, h := range []map[string]string{nil, {"Authorization": "Bearer wrong-token-0123456789"},
		{"Authorization": "Bearer " + token, "Origin": "http://evil.example"}} {
		if code, body, _ := e.do("POST", "/api/v1/dead-letters/requeue", `{"ids":["`+id+`"]}`, h); code != 401 && code != 403 {
			t.Fatalf("API requeue with %v: %d %s", h, code, body)
		}
	}
	// A form without a session, and with a session but no CSRF token.
	vals := url.Values{"op": {"requeue"}, "id": {id}, "reason": {"the agent is fixed"}}
	if code, body, _ := e.do("POST", "/dead-letters", vals.Encode(), map[string]string{"Content-Type": form}); code != 401 || !strings.Contains(body, "sign in") {
		t.Fatalf("form without a session: %d %s", code, body)
	}
	code, _, h := e.do("POST", "/login", url.Values{"token": {token}, "next": {"/dead-letters"}}.Encode(), map[string]string{"Content-Type": form})
	cookie := h.Get("Set-Cookie")
	if code != 303 || !strings.Contains(cookie, "HttpOnly") || !strings.Contains(cookie, "SameSite=Strict") {
		t.Fatalf("sign in: %d %q", code, cookie)
	}
	cookie = strings.Split(cookie, ";")[0]
	if code, body, _ := e.do("POST", "/dead-letters", vals.Encode(), map[string]string{"Content-Type": form, "Cookie": cookie}); code != 403 || !strings.Contains(body, "CSRF") {
		t.Fatalf("form without CSRF token: %d %s", code, body)
	}
	if n, _ := e.rdb.XLen(t.Context(), e.topo.Dead()).Result(); n != 1 {
		t.Fatalf("a refused write changed the dead letters: %d left", n)
	}
	// Signed in, the page carries the CSRF token; with it the requeue goes through.
	_, page, _ := e.do("GET", "/dead-letters", "", map[string]string{"Cookie": cookie})
	m := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token on the signed-in page:\n%s", page)
	}
	vals.Set("csrf", m[1])
	if code, body, h := e.do("POST", "/dead-letters", vals.Encode(), map[string]string{"Content-Type": form, "Cookie": cookie}); code != 303 || h.Get("Location") != "/dead-letters?done=requeued&n=1" {
		t.Fatalf("signed-in requeue: %d %v %s", code, h.Get("Location"), body)
	}
	if n, _ := e.rdb.XLen(t.Context(), e.topo.Dead()).Result(); n != 0 {
		t.Fatalf("requeued dead letter still there (%d)", n)
	}
	// The API with the token: purge of selected ids.
	id2, id3 := e.bury("RHEL-7", "x"), e.bury("RHEL-8", "y")
	code, body, _ := e.do("POST", "/api/v1/dead-letters/purge", `{"ids":["`+id2+`"],"reason":"noise"}`, map[string]string{"Authorization": "Bearer " + token})
	var rep inspect.PurgeReport
	if code != 200 || json.Unmarshal([]byte(body), &rep) != nil || rep.Purged != 1 {
		t.Fatalf("API purge: %d %s", code, body)
	}
	left, _ := e.in.DeadLetters(t.Context(), inspect.DeadFilter{})
	if len(left) != 1 || left[0].ID != id3 {
		t.Fatalf("purge of one selected id left %v", left)
	}
}

func TestReadOnlyWithoutToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	id := e.bury("RHEL-9", "boom")
	_, page := e.get("/dead-letters")
	if !strings.Contains(page, "read-only") || strings.Contains(page, `id="requeue"`) {
		t.Fatalf("read-only page offers writes:\n%s", page)
	}
	for _, c := range [][2]string{{"/api/v1/dead-letters/requeue", `{"ids":["` + id + `"]}`}, {"/api/v1/leases/release", `{"agent":"triage","issue":"RHEL-9"}`}} {
		code, body, _ := e.do("POST", c[0], c[1], map[string]string{"Authorization": "Bearer anything-at-all-123"})
		if code != 403 || !strings.Contains(body, "read-only") {
			t.Fatalf("POST %s on a read-only console: %d %s", c[0], code, body)
		}
	}
	if code, _, _ := e.do("POST", "/login", "token=x", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}); code != 403 {
		t.Fatalf("sign in on a read-only console: %d", code)
	}
}

func TestAPIHasTheCLIShapes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	e.publish("RHEL-10")
	e.bury("RHEL-10", "boom")
	for path, into := range map[string]any{"/api/v1/leases": &inspect.LocksReport{}, "/api/v1/streams": &inspect.StreamsReport{},
		"/api/v1/pending": &inspect.PendingReport{}, "/api/v1/issues/RHEL-10": &inspect.HistoryReport{},
		"/api/v1/dead-letters": &inspect.DeadLettersReport{}} {
		code, body := e.get(path)
		dec := json.NewDecoder(strings.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(into); code != 200 || err != nil {
			t.Fatalf("%s: %d %v\n%s", path, code, err, body)
		}
	}
	_, body := e.get("/api/v1/issues/RHEL-10")
	var h inspect.HistoryReport
	_ = json.Unmarshal([]byte(body), &h)
	if h.Issue != "RHEL-10" || len(h.Events) != 2 {
		t.Fatalf("history: %+v", h)
	}
}

func TestForceReleaseBehindAConfirmation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	ctx := t.Context()
	le, err := e.locker.Acquire(ctx, "triage", "RHEL-11", lease.AcquireOptions{Owner: "pod-a", MessageID: "5-0"})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(ctx)
	_, page := e.get("/leases")
	if !strings.Contains(page, `href="/leases/release?agent=triage&amp;issue=RHEL-11"`) {
		t.Fatalf("leases page without a force release link:\n%s", page)
	}
	// The link asks first: the confirmation page changes nothing.
	code, confirm := e.get("/leases/release?agent=triage&issue=rhel-11")
	if code != 200 || !strings.Contains(confirm, "Force release triage RHEL-11?") || !strings.Contains(confirm, "pod-a") {
		t.Fatalf("confirmation: %d\n%s", code, confirm)
	}
	if _, err := e.in.Lease(ctx, "triage", "RHEL-11"); err != nil {
		t.Fatalf("the confirmation page released the lease: %v", err)
	}
	// Confirmed through the API with the token: released, fence bumped.
	code, body, _ := e.do("POST", "/api/v1/leases/release", `{"agent":"triage","issue":" rhel-11 ","reason":"stuck run"}`, map[string]string{"Authorization": "Bearer " + token})
	var rel inspect.Released
	if code != 200 || json.Unmarshal([]byte(body), &rel) != nil || rel.Holder == nil || rel.Holder.Owner != "pod-a" || rel.Fence <= le.Fence() {
		t.Fatalf("release: %d %s", code, body)
	}
	if _, err := e.in.Lease(ctx, "triage", "RHEL-11"); !errors.Is(err, inspect.ErrNotFound) {
		t.Fatalf("lease after release: %v", err)
	}
}

// The Leases page shows the run limits' slots beside the leases (issue 37 item 2), as
// `locks` and /api/v1/leases do: each limit key, its slots used of its limit and the
// events waiting for one; and no such table while no limit key is in use.
func TestLeasesPageShowsRunLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	ctx := t.Context()
	if _, page := e.get("/leases"); strings.Contains(page, `id="slots"`) {
		t.Fatalf("a run limits table with no limit key in use:\n%s", page)
	}
	stream := e.ns + "limited"
	if err := e.rdb.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	req := func(id string) lease.SlotRequest {
		return lease.SlotRequest{Limits: []lease.Limit{{Key: "agent:rebase", N: 1}}, LineID: id, Issue: "RHEL-12",
			Event: lease.QueuedEvent{Stream: stream, Fields: map[string]any{"slot_from": id}}}
	}
	held, err := e.locker.TakeSlots(ctx, req("1-1"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	if _, err := e.locker.TakeSlots(ctx, req("2-1")); !errors.Is(err, lease.ErrSlotsFull) {
		t.Fatalf("second take: %v, want it waiting", err)
	}
	for _, p := range []string{"/leases", "/leases?fragment=1"} {
		_, page := e.get(p)
		row := regexp.MustCompile(`(?s)<tr data-limit="agent:rebase">.*?</tr>`).FindString(page)
		if !strings.Contains(row, `<td class="num used">1</td><td class="num limit">1</td>`) ||
			!strings.Contains(row, `<td class="num waiting">1</td>`) || !strings.Contains(row, "1/1 used, 1 waiting") {
			t.Fatalf("GET %s: the run limits row %q, want agent:rebase 1 of 1 used, 1 waiting:\n%s", p, row, page)
		}
	}
}
