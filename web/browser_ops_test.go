package web_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// storyIssue writes the history of a demo issue, RHEL-50, a minute ago: its triage
// request ran and failed (fence 1), was retried (fence 2) while a second request was
// dropped and a follow-up was delivered to the run, which then succeeded; then its
// rebase on c9s ran. Entries carry explicit ids (times), so the story has a real span.
func (e *env) storyIssue(key string) {
	e.t.Helper()
	ctx := context.Background()
	base := time.Now().Add(-time.Minute).UnixMilli()
	id := func(ms int64) string { return strconv.FormatInt(base+ms, 10) + "-0" }
	triage, rebase := e.topo.Stream("triage", "", false), e.topo.Stream("rebase", "c9s", false)
	request := func(stream, et string, at int64, meta map[string]string) {
		task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"` + key + `","jira_issue":"` + key + `"}}`))
		msg, err := event.New(et, key, task, nil)
		if err != nil {
			e.t.Fatal(err)
		}
		for k, v := range meta {
			msg.Metadata.Set(k, v)
		}
		if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: id(at), Values: event.Encode(msg)}).Err(); err != nil {
			e.t.Fatal(err)
		}
	}
	record := func(at int64, v map[string]any) {
		v["issue_key"] = key
		if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: e.topo.Results(), ID: id(at), Values: v}).Err(); err != nil {
			e.t.Fatal(err)
		}
	}
	request(triage, event.TriageRequested, 0, nil)
	record(8000, map[string]any{"event_type": event.StageFailed, "agent": "triage", "stream": triage, "message_id": id(0), "fence": "1",
		"outcome": "failed", "detail": `{"error":"exec runner: exit status 1; stderr: the builder went away"}`})
	request(triage, event.TriageRequested, 10000, map[string]string{event.MetaReplayOf: id(0)})
	request(triage, event.TriageRequested, 14000, nil)
	record(14050, map[string]any{"event_type": event.LockDropped, "agent": "triage", "stream": triage, "message_id": id(14000),
		"holder": "w1-0", "holder_fence": "2", "holder_message_id": id(10000), "reason": "locked"})
	record(20000, map[string]any{"event_type": event.FollowupDelivered, "agent": "triage", "stream": triage, "message_id": id(10000),
		"fence": "2", "detail": `{"comment_author":"maintainer","comment_id":"10001"}`})
	record(30000, map[string]any{"event_type": event.StageDone, "agent": "triage", "stream": triage, "message_id": id(10000), "fence": "2",
		"outcome": "rebase", "detail": `{"resolution":"rebase","branch":"c9s"}`})
	request(rebase, event.RebaseRequested, 31000, nil)
	record(45000, map[string]any{"event_type": event.StageDone, "agent": "rebase", "stream": rebase, "message_id": id(31000), "fence": "1",
		"outcome": "done"})
}

// TestBrowserOperatorsAuditAndStory drives the console in headless Chromium: a viewer's
// force release is refused (403) and recorded, an operator's goes through, the audit
// page shows both; the story of a demo issue draws its lanes, its failed run and its
// retry, the drop, the follow-up and the operator's action, and the page fits the
// window. It saves screenshots under STORY_SCREENSHOTS (default /tmp).
func TestBrowserOperatorsAuditAndStory(t *testing.T) {
	exe := chromium(t)
	e := rolesEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	e.storyIssue("RHEL-50")
	if _, err := e.locker.Acquire(ctx, "triage", "RHEL-50", lease.AcquireOptions{Owner: "pod-stuck", MessageID: "1-0"}); err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("STORY_SCREENSHOTS")
	if dir == "" {
		dir = os.TempDir()
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true), chromedp.WindowSize(1280, 900))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	b := &opsBrowser{t: t, ctx: bctx, dir: dir, base: e.ts.URL}
	b.viewerIsRefused(ctx, e)
	b.operatorReleases(ctx, e)
	b.auditShowsBoth()
	b.story()
}

// opsBrowser is a headless Chromium tab on the console at base; screenshots go to dir.
type opsBrowser struct {
	t    *testing.T
	ctx  context.Context
	dir  string
	base string
}

// do runs steps, failing the test with what.
func (b *opsBrowser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, steps...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates js in the page.
func (b *opsBrowser) eval(js string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](js))
	if err != nil {
		b.t.Fatalf("%s: %v", js, err)
	}
	return s
}

// shot saves a full screenshot as ymirflow-NAME.png.
func (b *opsBrowser) shot(name string) {
	t := b.t
	t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	p := b.dir + "/ymirflow-" + name + ".png"
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s", p)
}

// signIn signs in with token tok.
func (b *opsBrowser) signIn(tok string) {
	b.t.Helper()
	b.do("sign in", chromedp.Navigate(b.base+"/login?next=/leases"), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), tok), chromedp.Click(chromedp.CSS("#signin")), chromedp.WaitVisible(chromedp.CSS("#whoami")))
}

// release force-releases RHEL-50's triage lease with reason; it returns the page's
// error or notice and its title.
func (b *opsBrowser) release(reason string) string {
	b.t.Helper()
	b.do("force release", chromedp.Navigate(b.base+"/leases/release?agent=triage&issue=RHEL-50"), chromedp.WaitVisible(chromedp.CSS("#reason")),
		chromedp.SendKeys(chromedp.CSS("#reason"), reason), chromedp.Click(chromedp.CSS("#confirm-release")),
		chromedp.WaitVisible(chromedp.CSS("#error, #notice")))
	return b.eval(`(document.querySelector("#error") || document.querySelector("#notice")).innerText + " | " + document.title`)
}

// count counts the story's elements matching sel.
func (b *opsBrowser) count(sel string) int {
	n, err := strconv.Atoi(b.eval(`String(document.querySelectorAll(` + strconv.Quote("svg#story "+sel) + `).length)`))
	if err != nil {
		b.t.Fatal(err)
	}
	return n
}

// viewerIsRefused: a viewer cannot write: 403, and the lease stays.
func (b *opsBrowser) viewerIsRefused(ctx context.Context, e *env) {
	t := b.t
	b.signIn(viewerToken)
	if who := b.eval(`document.querySelector("#whoami").innerText`); who != "vera · viewer" {
		t.Fatalf("signed in as %q", who)
	}
	if got := b.release("I am only looking"); !strings.Contains(got, "refused: role viewer may not release") || !strings.Contains(got, "Forbidden") {
		t.Fatalf("a viewer's release: %q", got)
	}
	if _, err := e.in.Lease(ctx, "triage", "RHEL-50"); err != nil {
		t.Fatalf("a viewer's release released the lease: %v", err)
	}
	b.do("sign out", chromedp.Navigate(b.base+"/leases"), chromedp.Click(chromedp.CSS(`form[action="/logout"] button`)), chromedp.WaitVisible(chromedp.CSS("#notice")))
}

// operatorReleases: an operator can force-release the lease.
func (b *opsBrowser) operatorReleases(ctx context.Context, e *env) {
	t := b.t
	b.signIn(operatorToken)
	if got := b.release("pod-stuck hangs on a dead builder"); !strings.Contains(got, "Lease force-released") {
		t.Fatalf("an operator's release: %q", got)
	}
	if _, err := e.in.Lease(ctx, "triage", "RHEL-50"); err == nil {
		t.Fatal("the operator's release left the lease")
	}
}

// auditShowsBoth: the audit page shows the operator's release and the viewer's refusal.
func (b *opsBrowser) auditShowsBoth() {
	t := b.t
	b.do("audit page", chromedp.Navigate(b.base+"/audit"), chromedp.WaitVisible(chromedp.CSS("#audit")))
	rows := b.eval(`[...document.querySelectorAll("#audit tbody tr")].map(r => r.innerText.replace(/\s+/g, " ")).join("\n")`)
	lines := strings.Split(rows, "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "otto operator") || !strings.Contains(lines[0], "pod-stuck hangs on a dead builder") ||
		!strings.Contains(lines[0], "done") || !strings.Contains(lines[1], "vera viewer") || !strings.Contains(lines[1], "refused") ||
		!strings.Contains(lines[1], "agent=triage issue=RHEL-50") || !strings.Contains(lines[1], "I am only looking") {
		t.Fatalf("audit rows:\n%s", rows)
	}
	b.shot("audit")
}

// story: the story of RHEL-50 draws its lanes, its failed run and its retry in time
// order, the drop, the follow-up and the operator's actions, and fits the window.
func (b *opsBrowser) story() {
	t := b.t
	b.do("issue page", chromedp.Navigate(b.base+"/issue?key=rhel-50"), chromedp.WaitVisible(chromedp.CSS("svg#story")))
	lanes := b.eval(`[...document.querySelectorAll("svg#story .lane-label")].map(l => l.textContent).join(",")`)
	if lanes != "triage,rebase c9s" {
		t.Errorf("lanes %q, want triage,rebase c9s", lanes)
	}
	for sel, want := range map[string]int{".run.failed": 1, ".run.done": 2, ".mark.dropped": 1, ".mark.followup": 1,
		".mark.operator": 2, ".mark.queued": 4, ".axis text": 3} {
		if got := b.count(sel); got < want || (sel != ".axis text" && got != want) {
			t.Errorf("story: %d %s, want %d", got, sel, want)
		}
	}
	if ops := b.eval(`[...document.querySelectorAll("svg#story .mark.operator text")].map(l => l.textContent).join(",")`); ops != "release refused,release" {
		t.Errorf("operator markers %q, want the viewer's refusal and the operator's release", ops)
	}
	labels := b.eval(`[...document.querySelectorAll("svg#story .run text")].map(l => l.textContent).join(",")`)
	if labels != "fence 1 · failed,fence 2 · done,fence 1 · done" {
		t.Errorf("run labels %q", labels)
	}
	// The retry's bar starts after the failed run's end, on the same lane: drawn in
	// time order, left to right.
	xs := b.eval(`[...document.querySelectorAll("svg#story .run rect")].map(r => r.getAttribute("x") + "+" + r.getAttribute("width") + "@" + r.getAttribute("y")).join(",")`)
	var bars [3][3]int
	if _, err := fmt.Sscanf(strings.ReplaceAll(strings.ReplaceAll(strings.ReplaceAll(xs, "+", " "), "@", " "), ",", " "), "%d %d %d %d %d %d %d %d %d",
		&bars[0][0], &bars[0][1], &bars[0][2], &bars[1][0], &bars[1][1], &bars[1][2], &bars[2][0], &bars[2][1], &bars[2][2]); err != nil ||
		bars[1][0] < bars[0][0]+bars[0][1] || bars[0][2] != bars[1][2] || bars[2][2] <= bars[1][2] || bars[2][0] < bars[1][0]+bars[1][1] {
		t.Errorf("run bars (x+w@y) %s: the retry must start after the failure, on its lane; the rebase after both, below", xs)
	}
	if fits := b.eval(`String(document.documentElement.scrollWidth <= window.innerWidth)`); fits != "true" {
		t.Errorf("the issue page is wider than the window: %s px", b.eval(`String(document.documentElement.scrollWidth)`))
	}
	b.shot("story")
}
