package web_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/web"
)

// TestOverviewCountsPausedWork: the per-agent view's paused column counts the events
// an operator's pause holds back from that agent's streams, and only from them.
func TestOverviewCountsPausedWork(t *testing.T) {
	t.Parallel()
	e := rolesEnv(t)
	ctx := context.Background()
	p := e.locker.Pauses()
	if _, err := p.Set(ctx, lease.Pause{Scope: "agent:triage", Reason: "test", By: "test"}); err != nil {
		t.Fatal(err)
	}
	triage := e.topo.Stream("triage", "", false)
	for _, id := range []string{"1-1", "1-2"} {
		res, err := p.Check(ctx, lease.PauseTarget{Agent: "triage", Issue: "RHEL-5"}, lease.ParkEntry{Stream: triage,
			Group: e.topo.Group("triage", ""), ID: id, LineID: id, Issue: "RHEL-5",
			Fields: func() (map[string]any, error) { return map[string]any{"payload": "{}"}, nil }})
		if err != nil || res.Verdict != lease.ParkedNow {
			t.Fatalf("park %s: %+v %v", id, res, err)
		}
	}
	code, body := e.get("/api/v1/overview")
	var ov web.Overview
	if err := json.Unmarshal([]byte(body), &ov); code != 200 || err != nil {
		t.Fatalf("GET /api/v1/overview: %d %v %s", code, err, body)
	}
	found := false
	for _, r := range ov.Running {
		want := int64(0)
		if r.Agent == "triage" {
			want, found = 2, true
		}
		if r.Paused != want {
			t.Errorf("%s %s: paused %d, want %d", r.Agent, r.Branch, r.Paused, want)
		}
	}
	if !found {
		t.Fatalf("no triage row in %s", body)
	}
}
