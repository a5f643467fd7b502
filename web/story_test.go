package web_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/web"
)

// TestIssueStoryIsDrawn: the issue page draws the story of a demo issue (lanes, run bars
// labelled with fence and outcome, markers for the drop and the follow-up) above the
// table, and /api/v1/audit answers with the trail.
func TestIssueStoryIsDrawn(t *testing.T) {
	t.Parallel()
	e := rolesEnv(t)
	e.storyIssue("RHEL-51")
	code, body := e.get("/issue?key=RHEL-51&fragment=1")
	if code != 200 {
		t.Fatalf("issue page: %d", code)
	}
	count := func(re string) int { return len(regexp.MustCompile(re).FindAllString(body, -1)) }
	for re, want := range map[string]int{`<text class="lane-label"[^>]*>triage</text>`: 1, `<text class="lane-label"[^>]*>rebase c9s</text>`: 1,
		`<g class="run failed">`: 1, `<g class="run done">`: 2, `<g class="mark dropped">`: 1, `<g class="mark followup">`: 1,
		`<g class="mark queued">`: 4, `>fence 1 · failed</text>`: 1, `>fence 2 · done</text>`: 1} {
		if got := count(re); got != want {
			t.Errorf("story: %d of %s, want %d", got, re, want)
		}
	}
	if strings.Index(body, `id="story"`) > strings.Index(body, `id="timeline"`) {
		t.Error("the story is not above the table")
	}
	// A refused write shows on the audit API, and on the story as a marker.
	code, out, _ := e.do("POST", "/api/v1/leases/release", `{"agent":"triage","issue":"rhel-51","reason":"curious"}`,
		map[string]string{"Authorization": "Bearer " + viewerToken})
	if code != 403 {
		t.Fatalf("viewer release: %d %s", code, out)
	}
	var rep web.AuditReport
	_, out = e.get("/api/v1/audit?issue=rhel-51&action=release&since=1h")
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Records) != 1 || rep.Records[0].Who != "vera" ||
		rep.Records[0].Outcome != "refused" || rep.Records[0].Reason != "curious" {
		t.Fatalf("audit API: %v %s", err, out)
	}
	if _, body = e.get("/issue?key=RHEL-51&fragment=1"); !strings.Contains(body, `<g class="mark operator">`) || !strings.Contains(body, ">release refused</text>") {
		t.Errorf("the story lacks the refused release")
	}
	for _, bad := range []string{"?since=yesterday", "?limit=0", "?issue=not%20a%20key"} {
		if code, _ := e.get("/api/v1/audit" + bad); code != 400 {
			t.Errorf("audit API %s: %d, want 400", bad, code)
		}
	}
}
