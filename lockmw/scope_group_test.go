package lockmw_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// Issue 34, item 2, through the middleware: under scope group, two events of one issue
// with different group values never run at once under one agent, on either key
// format: the second meets the agent's own key (its conflict names scope agent and the
// first run), and once the first has ended it runs with the next fence of the same
// sequence. Before, on the cluster key format, the agent's key was tagged with each
// event's group value, and both ran.
func TestScopeGroupOneAgentKeyPerIssue(t *testing.T) {
	t.Parallel()
	for name, f := range map[string]lease.KeyFormat{"compat": lease.KeysCompat, "cluster keys": lease.KeysCluster} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rdb, ns := redistest.Client(t)
			l, err := lease.New(rdb, lease.Options{Scope: ns, Format: f})
			if err != nil {
				t.Fatal(err)
			}
			checkScopeGroupOneAgentKey(t, l)
		})
	}
}

func checkScopeGroupOneAgentKey(t *testing.T, l *lease.Locker) {
	t.Helper()
	scopes, err := lease.ParseScopes("group:m:lock_key")
	if err != nil {
		t.Fatal(err)
	}
	var conflicts []lockmw.Conflict
	record := func(_ context.Context, _ redis.Pipeliner, c lockmw.Conflict) { conflicts = append(conflicts, c) }
	mw, err := lockmw.NewMiddleware(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "backport", Scopes: scopes, OnConflict: record})
	if err != nil {
		t.Fatal(err)
	}
	event := func(uuid, group string) *message.Message {
		msg := message.NewMessage(uuid, []byte(`{"metadata":{"issue":"RHEL-7"}}`))
		msg.Metadata.Set("lock_key", group)
		return msg
	}
	var fences []int64
	var inner error
	running := 0
	var h message.HandlerFunc
	h = mw.Handler(func(msg *message.Message) ([]*message.Message, error) {
		le, _ := lockmw.LeaseFrom(msg.Context())
		fences = append(fences, le.Fence())
		if running++; running > 1 {
			inner = fmt.Errorf("%s ran while another event of RHEL-7 ran", msg.UUID)
		}
		defer func() { running-- }()
		if msg.UUID == "e1" {
			// Another event of the issue, another group value, meanwhile.
			if _, err := h(event("e2", "zlib")); err != nil {
				inner = errors.Join(inner, err)
			}
		}
		return nil, nil
	})
	if _, err := h(event("e1", "openssl")); err != nil {
		t.Fatal(err)
	}
	if inner != nil {
		t.Fatal(inner)
	}
	if len(conflicts) != 1 || conflicts[0].Holder.Scope != lease.ScopeAgent || conflicts[0].Holder.Issue != "RHEL-7" {
		t.Fatalf("conflicts %+v, want e2 to meet the agent's own key", conflicts)
	}
	if _, err := h(event("e3", "zlib")); err != nil {
		t.Fatal(err)
	}
	if len(fences) != 2 || fences[1] != fences[0]+1 {
		t.Fatalf("fences %v, want two runs on one sequence", fences)
	}
}
