package web_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/chromedp/chromedp"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
)

// chromium finds Debian's chromium (CHROMIUM names another binary).
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, n := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	t.Fatal("the browser test needs chromium: apt-get install -y chromium (.ci/run installs it), or CHROMIUM=/path/to/chrome")
	return ""
}

// TestBrowserEndToEnd drives the console in headless Chromium while a pipeline runs:
// a lease appears on the overview without a reload and its TTL counts down on the
// leases page, an issue's timeline is found from a sloppy key, a write without the
// token is refused, and a requeued dead letter leaves the list. With
// WEB_SCREENSHOTS=DIR it saves a screenshot of every page there.
func TestBrowserEndToEnd(t *testing.T) {
	// Not parallel: it drives a headless Chromium (heavy on a 2-core CI machine) and times a lease's appearance and its TTL's countdown against the console's 500 ms refresh.
	exe := chromium(t)
	e := newEnv(t, token)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()

	// The pipeline: RHEL-7 holds its lease until released; RHEL-9 always fails (dead
	// letter, with a secret in its error that must be shown redacted).
	release := make(chan struct{})
	e.start(ctx, message.NoPublishHandlerFunc(func(msg *message.Message) error {
		switch msg.Metadata.Get(event.MetaIssueKey) {
		case "RHEL-7":
			select {
			case <-release:
			case <-msg.Context().Done():
			}
			return nil
		case "RHEL-9":
			// A long unbroken path in the message: the timeline must wrap it (issue 35).
			return fmt.Errorf("agent crashed printing %s in %s", secret, strings.Repeat("/a-long-path-segment", 15))
		}
		return nil
	}))
	defer close(release)
	e.results(40)

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true), chromedp.WindowSize(1280, 900))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	b := &browser{t: t, ctx: bctx, shots: os.Getenv("WEB_SCREENSHOTS")}
	base := e.ts.URL
	start := time.Now()
	browseLease(b, e, base)
	deadID := browseTimelineAndDeadLetters(b, e, base)
	browseWrites(ctx, b, e, base, deadID)
	t.Logf("browser steps took %s", time.Since(start).Round(time.Millisecond))
}

// browser is TestBrowserEndToEnd's headless Chromium tab, and its steps.
type browser struct {
	t     *testing.T
	ctx   context.Context
	shots string // WEB_SCREENSHOTS: where screenshots go ("": none)
}

// shot saves a screenshot of the page as console-NAME.png, when asked to.
func (b *browser) shot(name string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		if b.shots == "" {
			return nil
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(b.shots, "console-"+name+".png"), png, 0o644)
	})
}

// do runs steps, and says how long they took.
func (b *browser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	t0 := time.Now()
	if err := chromedp.Do(b.ctx, steps...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
	b.t.Logf("%s: %s", what, time.Since(t0).Round(time.Millisecond))
}

// waitFor polls a JavaScript condition; on timeout it says where the browser is.
func (b *browser) waitFor(what, cond string) {
	b.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		ok, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`!!(`+cond+`)`))
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			loc, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`location.href + "\n" + document.body.innerText.slice(0, 800)`))
			b.t.Fatalf("%s: not within 20s (%v); the browser is at %s", what, err, loc)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// text reads an element's text inside the page, in one evaluation: the console
// replaces live rows while it refreshes them, so a node looked up by id in one
// round trip can be gone by the next ("No node with given id found").
func (b *browser) text(sel string) string {
	b.t.Helper()
	js := `(() => { const e = document.querySelector(` + strconv.Quote(sel) + `); return e ? e.innerText : ""; })()`
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](js))
		if err == nil && s != "" {
			return s
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("text of %s: %q, %v", sel, s, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// browseLease is steps 1 and 2: the lease shows up on the overview by itself, and its
// TTL counts down on the leases page.
func browseLease(b *browser, e *env, base string) {
	t := b.t
	// 1. The overview is open when the work starts: the lease shows up by itself.
	b.do("open the overview", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#running")))
	published := time.Now()
	e.publish("RHEL-7")
	b.do("the running lease appears without a reload", chromedp.WaitVisible(`//table[@id="running"]//td[contains(., "RHEL-7")]`))
	t.Logf("lease visible on the overview %s after publishing", time.Since(published).Round(time.Millisecond))
	b.do("overview screenshot", b.shot("overview"))

	// 2. Leases: the TTL counts down.
	ttlSel := `tr[data-issue="RHEL-7"] td.ttl`
	b.do("open leases", chromedp.Navigate(base+"/leases"), chromedp.WaitVisible(chromedp.CSS(ttlSel)))
	ttl1 := b.text(ttlSel)
	d1 := parseTTL(t, ttl1)
	if d1 > 9*time.Second || d1 < 4*time.Second {
		t.Fatalf("TTL %s of a fresh 9s lease", ttl1)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		b.do("wait", chromedp.Sleep(300*time.Millisecond))
		if ttl2 := b.text(ttlSel); parseTTL(t, ttl2) < d1 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("TTL did not count down: %s then %s", ttl1, ttl2)
		}
	}
	b.do("leases screenshot", b.shot("leases"))
}

// browseTimelineAndDeadLetters is steps 3 and 4: an issue's timeline from the search
// box, a dead letter appearing while the list is open, redacted, and a timeline that
// fits the window. It returns the dead letter's id.
func browseTimelineAndDeadLetters(b *browser, e *env, base string) string {
	t := b.t
	// 3. One issue's timeline from the search box, any key form.
	b.do("search an issue", chromedp.Navigate(base+"/pending"), chromedp.WaitVisible(chromedp.CSS(`header input[name=key]`)),
		b.shot("pending"),
		chromedp.SendKeys(chromedp.CSS(`header input[name=key]`), " rhel-7 "), chromedp.Submit(chromedp.CSS(`header input[name=key]`)),
		chromedp.WaitVisible(chromedp.CSS(`#timeline`)))
	if h1 := b.text("h1"); h1 != "RHEL-7" {
		t.Fatalf("timeline of %q", h1)
	}
	b.do("the timeline shows the request", chromedp.WaitVisible(`//table[@id="timeline"]//td[contains(., "triage.requested")]`), b.shot("issue"))

	// 4. Dead letters: RHEL-9 dies while the list is open.
	b.do("open dead letters", chromedp.Navigate(base+"/dead-letters"), chromedp.WaitVisible(chromedp.CSS("#dlq")))
	e.publish("RHEL-9")
	b.do("the dead letter appears", chromedp.WaitVisible(chromedp.CSS(`#dead tbody tr`)))
	attr, err := chromedp.Run(b.ctx, chromedp.AttributeValue(chromedp.CSS(`#dead tbody tr`), "data-id"))
	if err != nil || !attr.Exists {
		t.Fatalf("dead letter row without data-id: %v", err)
	}
	deadID := attr.Value
	b.do("dead letters screenshot", b.shot("dead-letters"))
	b.do("detail", chromedp.Navigate(base+"/dead-letters/"+deadID), chromedp.WaitVisible(chromedp.CSS("#deadletter")), b.shot("dead-letter"))
	if detail := b.text("#deadletter"); !strings.Contains(detail, "[redacted]") || strings.Contains(detail, secret) {
		t.Fatalf("dead letter detail not redacted:\n%s", detail)
	}

	// Its timeline fits the window: the long detail wraps, no horizontal scrolling.
	b.do("RHEL-9's timeline", chromedp.Navigate(base+"/issue?key=RHEL-9"), chromedp.WaitVisible(chromedp.CSS("#timeline td.detail")))
	if fits, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`document.documentElement.scrollWidth <= window.innerWidth`)); err != nil || !fits {
		w, _ := chromedp.Run(b.ctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth`))
		cols, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`[...document.querySelectorAll("#timeline tbody tr:last-child td")].map(td => td.offsetWidth + ":" + td.innerText.slice(0,60)).join(" | ")`))
		t.Fatalf("the timeline is %dpx wide in a 1280px window (%v): %s", w, err, cols)
	}
	// The overview's chart has a time axis: labelled ticks ending at "now".
	b.do("overview chart", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS(".chart .axis")))
	axis, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.querySelector(".chart .axis").textContent`))
	if err != nil || !strings.HasSuffix(strings.TrimSpace(axis), "now") || !regexp.MustCompile(`\d\d:\d\d`).MatchString(axis) {
		t.Fatalf("the chart's time axis reads %q (%v)", axis, err)
	}
	return deadID
}

// browseWrites is steps 5 and 6: a write without the token is refused; signed in, the
// requeued dead letter leaves the list.
func browseWrites(ctx context.Context, b *browser, e *env, base, deadID string) {
	t := b.t
	// 5. A write without the token is refused: the form, and the API from the page.
	row := `tr[data-id="` + deadID + `"] input[type=checkbox]`
	b.do("requeue without signing in", chromedp.Navigate(base+"/dead-letters"), chromedp.WaitVisible(chromedp.CSS(row)),
		chromedp.Click(chromedp.CSS(row)), chromedp.SendKeys(chromedp.CSS("#reason"), "agent fixed"),
		chromedp.Click(chromedp.CSS("#requeue")), chromedp.WaitVisible(chromedp.CSS("#error")))
	if refused := b.text("#error"); !strings.Contains(refused, "refused") {
		t.Fatalf("requeue without the token: %q", refused)
	}
	status, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](`fetch("/api/v1/dead-letters/requeue", {method: "POST", body: '{"ids":["`+deadID+`"]}'}).then(r => r.status)`, chromedp.EvalAwaitPromise))
	if err != nil || status != 401 {
		t.Fatalf("API requeue without the token from the browser: %d %v", status, err)
	}
	if _, err := e.in.DeadLetter(ctx, deadID); err != nil {
		t.Fatalf("a refused write changed the dead letters: %v", err)
	}

	// 6. Signed in, requeue it: it leaves the list (RHEL-9 fails again later under a
	// new id, which is fine: the requeued entry is gone).
	b.do("sign in", chromedp.Navigate(base+"/login?next=/dead-letters"), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS("#signin")))
	b.waitFor("signed in", `location.pathname == "/dead-letters" && document.querySelector('`+row+`')`)
	// The selection survives the page refreshing itself: the table is replaced (it loses
	// the mark set here) and the box is still ticked.
	b.do("select", chromedp.Click(chromedp.CSS(row)))
	if _, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`document.querySelector("#dead").__old = true`)); err != nil {
		t.Fatal(err)
	}
	b.waitFor("a refresh", `!document.querySelector("#dead").__old`)
	if kept, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`document.querySelector('`+row+`').checked`)); err != nil || !kept {
		t.Fatalf("the selection was lost on refresh (%v)", err)
	}
	b.do("requeue", chromedp.SendKeys(chromedp.CSS("#reason"), "agent fixed"), chromedp.Click(chromedp.CSS("#requeue")))
	b.waitFor("requeued", `location.search.includes("done=requeued") && document.querySelector("#notice")`)
	if notice := b.text("#notice"); !strings.Contains(notice, "Requeued 1") {
		t.Fatalf("after requeue: %q", notice)
	}
	gone, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`document.querySelector('tr[data-id="`+deadID+`"]') === null`))
	if err != nil || !gone {
		t.Fatalf("the requeued dead letter is still listed (%v)", err)
	}
	if _, err := e.in.DeadLetter(ctx, deadID); err == nil {
		t.Fatal("the requeued dead letter is still in the stream")
	}
}

// parseTTL reads a TTL cell (850ms, 29.5s, 1m05s).
func parseTTL(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		t.Fatalf("TTL cell %q: %v", s, err)
	}
	return d
}

// results adds n results records spread over the last 40 minutes, for the chart.
func (e *env) results(n int) {
	e.t.Helper()
	now := time.Now()
	types := []string{event.StageDone, event.StageDone, event.StageFailed, event.LockDropped}
	for i := range n {
		at := now.Add(-time.Duration(n-i) * time.Minute * 40 / time.Duration(n))
		err := e.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: e.topo.Results(), ID: fmt.Sprintf("%d-%d", at.UnixMilli(), i),
			Values: map[string]any{"event_type": types[i%len(types)], "agent": "triage", "issue_key": fmt.Sprintf("RHEL-%d", 100+i)}}).Err()
		if err != nil && !errors.Is(err, redis.Nil) {
			e.t.Fatal(err)
		}
	}
}
