package lockmw_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// With scope issue, a backport event for an issue a rebase run holds is dropped, and its
// record names the shared key and the rebase run; the handler sees its lease holding the
// shared key; the release frees it.
func TestScopeIssueAcrossAgents(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := locker(t, rdb, ns)
	ctx := context.Background()
	scopes, err := lease.ParseScopes("issue")
	if err != nil {
		t.Fatal(err)
	}
	var results []map[string]any
	record := func(_ context.Context, _ redis.Pipeliner, c lockmw.Conflict) {
		results = append(results, map[string]any{"issue": c.Issue, "scope": string(c.Holder.Scope), "key": c.Holder.Key,
			"holder_agent": c.Holder.Agent, "holder_issue": c.Holder.Issue})
	}
	rebase, err := lockmw.NewMiddleware(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "rebase", Scopes: scopes})
	if err != nil {
		t.Fatal(err)
	}
	backport, err := lockmw.NewMiddleware(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "backport", Scopes: scopes, OnConflict: record})
	if err != nil {
		t.Fatal(err)
	}
	payload := []byte(`{"metadata":{"issue":"RHEL-7"}}`)
	shared := l.SharedKeys(lease.ScopeKey{Scope: lease.ScopeIssue, Key: "RHEL-7"})
	var inner error
	h := rebase.Handler(func(msg *message.Message) ([]*message.Message, error) {
		le, _ := lockmw.LeaseFrom(msg.Context())
		if len(le.Shared()) != 1 || le.Shared()[0].Scope != lease.ScopeIssue {
			inner = errors.New("the handler's lease holds no shared issue key")
		}
		// A backport event meanwhile: dropped, not run.
		ran := false
		hb := backport.Handler(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })
		if _, err := hb(message.NewMessage("b1", payload)); err != nil {
			inner = err
		}
		if ran {
			inner = errors.New("backport ran while rebase held the issue")
		}
		return nil, nil
	})
	if _, err := h(message.NewMessage("r1", payload)); err != nil {
		t.Fatal(err)
	}
	if inner != nil {
		t.Fatal(inner)
	}
	if len(results) != 1 || results[0]["scope"] != "issue" || results[0]["key"] != "RHEL-7" || results[0]["holder_agent"] != "rebase" || results[0]["issue"] != "RHEL-7" {
		t.Fatalf("conflicts = %v", results)
	}
	if exists(t, rdb, shared.Lock) {
		t.Fatal("shared key left after the run")
	}
	// Now backport runs.
	ran := false
	hb := backport.Handler(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })
	if _, err := hb(message.NewMessage("b2", payload)); err != nil || !ran {
		t.Fatalf("backport after the release: ran %v, %v", ran, err)
	}
	_ = ctx
}

// A group key's field missing from the event is a bad event (ErrInvalidKey), never run
// without its lock; the m: form reads metadata.
func TestScopeGroupFromEvent(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := locker(t, rdb, ns)
	scopes, err := lease.ParseScopes("group:m:lock_key")
	if err != nil {
		t.Fatal(err)
	}
	mw, err := lockmw.NewMiddleware(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "backport", Scopes: scopes})
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	h := mw.Handler(func(msg *message.Message) ([]*message.Message, error) {
		ran++
		le, _ := lockmw.LeaseFrom(msg.Context())
		if sh := le.Shared(); len(sh) != 1 || sh[0].Key != "OPENSSL/RHEL-9" {
			t.Errorf("shared = %+v", sh)
		}
		return nil, nil
	})
	msg := message.NewMessage("u1", []byte(`{"metadata":{"issue":"RHEL-8"}}`))
	if _, err := h(msg); !errors.Is(err, lease.ErrInvalidKey) {
		t.Fatalf("no lock_key: err = %v, want ErrInvalidKey", err)
	}
	msg = message.NewMessage("u2", []byte(`{"metadata":{"issue":"RHEL-8"}}`))
	msg.Metadata.Set("lock_key", "openssl|rhel-9")
	if _, err := h(msg); !errors.Is(err, lease.ErrInvalidKey) {
		t.Fatalf("'|' inside a part: err = %v, want ErrInvalidKey", err)
	}
	msg = message.NewMessage("u3", []byte(`{"metadata":{"issue":"RHEL-8"}}`))
	msg.Metadata.Set("lock_key", " openssl/rhel-9 ")
	if _, err := h(msg); err != nil {
		t.Fatal(err)
	}
	if ran != 1 {
		t.Fatalf("ran %d times, want 1", ran)
	}
}

func TestScopeRefusesCoalesce(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := locker(t, rdb, ns)
	_, err := lockmw.NewMiddleware(lockmw.Config{Locker: l, Agent: "rebase", Policy: lockmw.Coalesce, Scopes: lease.Scopes{Issue: true},
		Source: &streamSource{}, MaxIdleTime: time.Hour})
	if err == nil || !strings.Contains(err.Error(), "Config.Scopes") {
		t.Fatalf("err = %v, want a refusal naming Config.Scopes", err)
	}
}

// Supersede replaces the run holding the agent's own lease; with a shared key (scope
// issue or group) the busy run may be another agent's or another issue's, which an
// event has no standing to cancel: refused, naming both settings. Without a shared
// key it is accepted.
func TestScopeRefusesSupersede(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := locker(t, rdb, ns)
	for _, scopes := range []lease.Scopes{{Issue: true}, {Group: []string{"metadata.target_branch"}}} {
		_, err := lockmw.NewMiddleware(lockmw.Config{Locker: l, Agent: "rebase", Policies: lockmw.Policies{
			Default: lockmw.Rule{Policy: lockmw.Drop}, ByType: map[string]lockmw.Rule{"rebase.requested": {Policy: lockmw.Supersede}}},
			Scopes: scopes, Source: &streamSource{}, MaxIdleTime: time.Hour})
		if err == nil || !strings.Contains(err.Error(), "Config.Scopes") || !strings.Contains(err.Error(), "supersede") {
			t.Fatalf("scopes %v: err = %v, want a refusal naming Config.Scopes and supersede", scopes, err)
		}
	}
	if _, err := lockmw.NewMiddleware(lockmw.Config{Locker: l, Agent: "rebase", Policy: lockmw.Supersede,
		Source: &streamSource{}, MaxIdleTime: time.Hour}); err != nil {
		t.Fatalf("supersede with scope agent: %v", err)
	}
}
