package web_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/delayq"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// The console's pending page shows a delayed event with when it runs again, and its
// leases page (and /api/v1/leases) the scope and key of each lease.
func TestConsoleShowsDelayedAndScopes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	ctx := context.Background()
	triage := e.topo.Stream("triage", "", false)
	e.publish("RHEL-9")
	if err := e.rdb.XGroupCreate(ctx, triage, e.topo.Group("triage", ""), "$").Err(); err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Hour).UTC()
	member, err := delayq.Member("1-1", map[string]any{"payload": "{}", "m:issue_key": "RHEL-9", "m:event_type": event.TriageRequested, "m:delays": "1"})
	if err != nil {
		t.Fatal(err)
	}
	e.rdb.ZAdd(ctx, delayq.Key(triage), redis.Z{Score: float64(until.UnixMilli()), Member: member})
	_, body := e.get("/pending?fragment=1")
	if !strings.Contains(body, "delayed until") || !strings.Contains(body, until.Format("2006-01-02 15:04")) || !strings.Contains(body, ">RHEL-9<") {
		t.Errorf("pending page does not show the delayed event:\n%s", body)
	}

	le, err := e.locker.Acquire(ctx, "backport", "RHEL-9", lease.AcquireOptions{Owner: "pod-c",
		Shared: []lease.ScopeKey{{Scope: lease.ScopeGroup, Key: "OPENSSL|RHEL-9.4"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(ctx)
	_, body = e.get("/leases?fragment=1")
	if !strings.Contains(body, `<td class="scope">group</td><td class="key">OPENSSL|RHEL-9.4</td>`) ||
		!strings.Contains(body, `<td class="scope">agent</td><td class="key">RHEL-9</td>`) {
		t.Errorf("leases page lacks the scopes:\n%s", body)
	}
	_, body = e.get("/api/v1/leases")
	if !strings.Contains(body, `"scope": "group",`) || !strings.Contains(body, `"key": "OPENSSL|RHEL-9.4",`) {
		t.Errorf("/api/v1/leases lacks the scope: %s", body)
	}
}
