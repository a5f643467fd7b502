package lease_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

func TestInspectManyFindsLiveLeasesInOneBatch(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{Owner: "w1"})
	ctx := context.Background()
	le, err := l.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{MessageID: "1-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(ctx)
	// A Python agent's plain lock: a key without a record.
	if err := rdb.Set(ctx, "lock:"+ns+"rebase:RHEL-2", "python", 0).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := l.InspectMany(ctx, []lease.Ref{
		{Agent: "triage", Issue: " rhel-1 "}, {Agent: "triage", Issue: "RHEL-1"},
		{Agent: "rebase", Issue: "RHEL-2"}, {Agent: "triage", Issue: "RHEL-3"}, {Agent: "triage", Issue: "../x"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("got %d leases, want 2: %+v", len(got), got)
	}
	info := got[lease.Ref{Agent: "triage", Issue: "RHEL-1"}]
	if info.Owner != "w1" || info.Fence != le.Fence() || info.MessageID != "1-1" || info.TTL <= 0 || info.AcquiredAt.IsZero() {
		t.Fatalf("triage RHEL-1 = %+v", info)
	}
	if plain, ok := got[lease.Ref{Agent: "rebase", Issue: "RHEL-2"}]; !ok || plain.Owner != "" {
		t.Fatalf("plain lock = %+v, %v", plain, ok)
	}
}

func TestListScansOnlyThisScopesLeases(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	l := newLocker(t, rdb, ns, lease.Options{})
	other := newLocker(t, rdb, ns+"other:", lease.Options{})
	for _, r := range []lease.Ref{{Agent: "triage", Issue: "RHEL-2"}, {Agent: "triage", Issue: "RHEL-1"}, {Agent: "rebase", Issue: "RHEL-1"}} {
		mustAcquire(t, l, r.Agent, r.Issue)
	}
	mustAcquire(t, other, "triage", "RHEL-9")

	all, err := l.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range all {
		names = append(names, i.Agent+"/"+i.Issue)
	}
	// The other scope lives under ns+"other:", which the pattern of ns also matches: its
	// agent then carries the rest of the scope and callers filter it out.
	want := []string{"other:triage/RHEL-9", "rebase/RHEL-1", "triage/RHEL-1", "triage/RHEL-2"}
	if len(names) != len(want) {
		t.Fatalf("List = %v, want %v", names, want)
	}
	for i := range want {
		if names[i] != want[i] {
			t.Fatalf("List = %v, want %v", names, want)
		}
	}
	triage, err := l.List(ctx, "triage")
	if err != nil {
		t.Fatal(err)
	}
	if len(triage) != 2 || triage[0].Issue != "RHEL-1" || triage[1].Issue != "RHEL-2" {
		t.Fatalf("List(triage) = %+v", triage)
	}
}

func TestListClusterFormat(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{Format: lease.KeysCluster})
	mustAcquire(t, l, "backport", "RHEL-4")
	got, err := l.List(context.Background(), "backport")
	if err != nil || len(got) != 1 || got[0].Agent != "backport" || got[0].Issue != "RHEL-4" {
		t.Fatalf("List = %+v, %v", got, err)
	}
}

// An operator's force-release fences out the old holder: its next fenced publish is
// refused, and the next holder's fence is above the old one's.
func TestForceReleaseFencesOutTheHolder(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	l := newLocker(t, rdb, ns, lease.Options{})
	old := mustAcquire(t, l, "triage", "RHEL-8")
	if _, err := old.XAdd(ctx, ns+"out", 0, map[string]any{"k": "before"}); err != nil {
		t.Fatalf("publish while held: %v", err)
	}
	fence, err := l.ForceRelease(ctx, "triage", "RHEL-8")
	if err != nil || fence <= old.Fence() {
		t.Fatalf("ForceRelease = %d, %v (old fence %d)", fence, err, old.Fence())
	}
	if _, err := old.XAdd(ctx, ns+"out", 0, map[string]any{"k": "after"}); !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("publish after force-release = %v, want ErrLeaseLost", err)
	}
	next := mustAcquire(t, l, "triage", "RHEL-8")
	if next.Fence() <= fence {
		t.Fatalf("next fence %d not above %d", next.Fence(), fence)
	}
	if _, err := old.XAdd(ctx, ns+"out", 0, map[string]any{"k": "late"}); !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("publish under the new holder's lease = %v, want ErrLeaseLost", err)
	}
	if n := rdb.XLen(ctx, ns+"out").Val(); n != 1 {
		t.Fatalf("stream has %d entries, want 1", n)
	}
}
