package xonce_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/xonce"
)

// The same append twice adds one entry and returns its id both times; another id adds
// another entry; a fenced append is refused once the lock holds another token, but a
// repeat of one that was made still answers with its entry.
func TestAppendOnce(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	stream, lock := ns+"ymir:results", ns+"lock"
	rdb.Set(ctx, lock, "tok", 0)
	a := xonce.Append{Stream: stream, ID: "a1", Values: map[string]any{"k": "v"}, Lock: lock, Token: "tok"}
	first, err := xonce.Run(ctx, rdb, a)
	if err != nil {
		t.Fatal(err)
	}
	again, err := xonce.Run(ctx, rdb, a)
	if err != nil || again != first {
		t.Fatalf("repeat: %q, %v; want %q", again, err, first)
	}
	if n := rdb.XLen(ctx, stream).Val(); n != 1 {
		t.Fatalf("%d entries after a repeat, want 1", n)
	}
	rdb.Set(ctx, lock, "other", 0)
	if id, err := xonce.Run(ctx, rdb, a); err != nil || id != first {
		t.Fatalf("repeat after the lease moved: %q, %v; want the first entry %q", id, err, first)
	}
	b := a
	b.ID = "a2"
	if _, err := xonce.Run(ctx, rdb, b); !errors.Is(err, xonce.ErrLeaseLost) {
		t.Fatalf("new fenced append under a lost lease: %v, want ErrLeaseLost", err)
	}
	if ttl := rdb.PTTL(ctx, xonce.MarkerKey(stream, "a1")).Val(); ttl <= 0 {
		t.Fatalf("marker has no TTL: %s", ttl)
	}
}

// The marker shares the stream's hash slot, so the script works on Redis Cluster.
func ExampleMarkerKey() {
	fmt.Println(xonce.MarkerKey("ymir:results", "dead-ymir:triage-1-0"))
	fmt.Println(xonce.MarkerKey("lock:{triage:RHEL-1}:q", "x"))
	// Output:
	// {ymir:results}:once:dead-ymir:triage-1-0
	// lock:{triage:RHEL-1}:q:once:x
}
