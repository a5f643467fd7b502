package xonce_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// An append that names an issue (Append.Issue, or the issue of ctx) files its entry in
// the issue's index of the stream in the same script: once however often it is sent,
// the newest IndexMax ids only, none that the stream trimmed, with a TTL; the index's
// start is the first id ever indexed. Appends naming no issue index nothing.
func TestAppendFilesTheEntryInItsIssuesIndex(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	stream := ns + "ymir:triage"
	idx := xonce.IndexKey(stream, "RHEL-1")
	first, err := xonce.Run(ctx, rdb, xonce.Append{Stream: stream, ID: "a", Issue: "RHEL-1", Values: map[string]any{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := xonce.Run(ctx, rdb, xonce.Append{Stream: stream, ID: "a", Issue: "RHEL-1", Values: map[string]any{"k": "v"}}); err != nil {
		t.Fatal(err)
	}
	second, err := xonce.Run(xonce.WithIssue(ctx, "RHEL-1"), rdb, xonce.Append{Stream: stream, ID: "b", Values: map[string]any{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := xonce.Run(ctx, rdb, xonce.Append{Stream: stream, ID: "c", Values: map[string]any{"k": "v"}}); err != nil {
		t.Fatal(err)
	}
	ids := func() []string {
		var out []string
		for _, m := range rdb.ZRange(ctx, idx, 0, -1).Val() {
			out = append(out, xonce.IndexID(m))
		}
		return out
	}
	if got := ids(); len(got) != 2 || got[0] != first || got[1] != second {
		t.Fatalf("index = %v, want [%s %s]", got, first, second)
	}
	if since := rdb.Get(ctx, xonce.IndexSinceKey(stream)).Val(); since != first {
		t.Fatalf("index start = %q, want %s", since, first)
	}
	if ttl := rdb.PTTL(ctx, idx).Val(); ttl <= 0 || ttl > xonce.IndexTTL {
		t.Fatalf("index TTL = %s", ttl)
	}
	// What the stream trimmed leaves the index at its next write.
	rdb.XTrimMinID(ctx, stream, second)
	rdb.XDel(ctx, stream, second)
	time.Sleep(2 * time.Millisecond) // a later millisecond than the trimmed entries
	third, err := xonce.Run(ctx, rdb, xonce.Append{Stream: stream, ID: "d", Issue: "RHEL-1", Values: map[string]any{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	rdb.XTrimMinID(ctx, stream, third)
	time.Sleep(2 * time.Millisecond)
	fourth, err := xonce.Run(ctx, rdb, xonce.Append{Stream: stream, ID: "e", Issue: "RHEL-1", Values: map[string]any{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(); len(got) != 2 || got[0] != third || got[1] != fourth {
		t.Fatalf("index after a trim = %v, want [%s %s]", got, third, fourth)
	}
	// At most IndexMax ids, the newest.
	pipe := rdb.Pipeline()
	for i := range xonce.IndexMax + 10 {
		xonce.Queue(ctx, pipe, xonce.Append{Stream: stream, ID: fmt.Sprint("n", i), Issue: "RHEL-1", Values: map[string]any{"k": "v"}})
	}
	cmds, err := pipe.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	last := cmds[len(cmds)-1].(*redis.Cmd).Val()
	if n := rdb.ZCard(ctx, idx).Val(); n != xonce.IndexMax {
		t.Fatalf("index holds %d ids, want %d", n, xonce.IndexMax)
	}
	if top := ids(); top[len(top)-1] != last {
		t.Fatalf("newest indexed %v, want %v", top, last)
	}
}

// The index shares the stream's hash slot, so the script works on Redis Cluster.
func ExampleIndexKey() {
	fmt.Println(xonce.IndexKey("ymir:results", "RHEL-1"))
	fmt.Println(xonce.IndexSinceKey("ymir:results"))
	// Output:
	// {ymir:results}:issue:RHEL-1
	// {ymir:results}:issue-index-since
}
