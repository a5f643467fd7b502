package web_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestBrowserPauseFromConsole (issue 38): an operator pauses a scope from the
// console's pauses page in headless Chromium; the pause is in the list `ymirflow
// locks` prints (the Inspector's Pauses, which locks reads) within a second of the
// click, every page shows it in the banner, and the resume button ends it. The page's
// refresh does not wipe the reason the operator types to resume.
func TestBrowserPauseFromConsole(t *testing.T) {
	exe := chromium(t)
	e := rolesEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true), chromedp.WindowSize(1280, 900))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eval := func(js string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		return s
	}
	base := e.ts.URL
	do("sign in", chromedp.Navigate(base+"/login?next=/pauses"), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), operatorToken), chromedp.Click(chromedp.CSS("#signin")), chromedp.WaitVisible(chromedp.CSS("#whoami")))
	do("pauses page", chromedp.Navigate(base+"/pauses"), chromedp.WaitVisible(chromedp.CSS("#pause-form")),
		chromedp.SendKeys(chromedp.CSS("#pause-scope"), "agent:rebase/c9s"), chromedp.SendKeys(chromedp.CSS("#pause-reason"), "builder upgrade"))
	clicked := time.Now()
	do("pause", chromedp.Click(chromedp.CSS("#pause-submit")))
	var seen time.Duration
	for {
		ps, err := e.in.Pauses(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) == 1 && ps[0].Scope == "agent:rebase/c9s" && ps[0].By == "otto" && ps[0].Reason == "builder upgrade" {
			seen = time.Since(clicked)
			break
		}
		if time.Since(clicked) > 5*time.Second {
			t.Fatalf("the pause is not in the locks' list 5 s after the click: %+v", ps)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if seen > time.Second {
		t.Errorf("the pause showed in locks %s after the click, want within a second", seen)
	}
	do("pause done", chromedp.WaitVisible(chromedp.CSS("#notice")))
	t.Logf("FIGURE console pause: in the locks' list %s after the click", seen.Round(time.Millisecond))
	do("leases page", chromedp.Navigate(base+"/leases"), chromedp.WaitVisible(chromedp.CSS("#pause-banner")))
	if b := eval(`document.querySelector("#pause-banner").innerText`); !strings.Contains(b, "agent:rebase/c9s") || !strings.Contains(b, "builder upgrade") {
		t.Errorf("banner: %q", b)
	}
	do("pauses page again", chromedp.Navigate(base+"/pauses"), chromedp.WaitVisible(chromedp.CSS("form.resume")))
	// The live part (the list, with its resume forms) refreshes every 500 ms here: until
	// the first keystroke it may be replaced between finding the field and typing into it.
	for try := 1; ; try++ {
		err := chromedp.Do(bctx, chromedp.SendKeys(chromedp.CSS(`form.resume input[name="reason"]`), "upgrade done"))
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "Could not find node") || try == 5 {
			t.Fatalf("type the reason to resume: %v", err)
		}
	}
	// Once typed, what the operator typed stays: the refreshes are held, not applied.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(eval(`document.querySelector("#updated").innerText`), "held") {
		if time.Now().After(deadline) {
			t.Fatalf("no refresh held while the reason is typed: %q", eval(`document.querySelector("#updated").innerText`))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if v := eval(`document.querySelector('form.resume input[name="reason"]').value`); v != "upgrade done" {
		t.Fatalf("the reason typed to resume is %q after a refresh", v)
	}
	do("resume", chromedp.Click(chromedp.CSS(`form.resume button`)), chromedp.WaitVisible(chromedp.CSS("#notice")))
	if n := eval(`String(document.querySelectorAll("#pause-banner").length)`); n != "0" {
		t.Errorf("the banner is still shown after the resume")
	}
	if ps, _ := e.in.Pauses(ctx); len(ps) != 0 {
		t.Errorf("pauses after the resume: %+v", ps)
	}
}
