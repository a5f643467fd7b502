package pipeline_test

import (
	"context"
	"errors"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/audit"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// procStatus reads a field of /proc/self/status in bytes (VmRSS, VmHWM).
func procStatus(t *testing.T, field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}

func settledHeap() uint64 {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// addHuge appends an entry of n payload bytes built by Redis itself (Lua string.rep), so
// the test process never holds it: whatever memory it costs here is the worker's.
func addHuge(t *testing.T, rdb *redis.Client, stream, key string, n int) string {
	t.Helper()
	id, err := rdb.Eval(context.Background(), `return redis.call('XADD', KEYS[1], '*',
		'_watermill_message_uuid', 'huge-1', 'm:issue_key', ARGV[1], 'm:event_type', 'triage.requested',
		'payload', '{"metadata":{"issue":"' .. ARGV[1] .. '"},"blob":"' .. string.rep('x', tonumber(ARGV[2])) .. '"}')`,
		[]string{stream}, key, n).Text()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// A 20 MB entry is dead-lettered with the reason, its size and a copy of at most 64 KiB,
// never run, and removed from its stream; the next event runs; the worker's memory goes
// back to where it was.
func TestOversizedEntryDeadLetteredWhileNextRuns(t *testing.T) {
	// Not parallel: it measures the process's heap, which parallel tests would grow (CI saw 18 MiB).
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const huge = 20 << 20
	hugeID := addHuge(t, e.rdb, e.triage(), "RHEL-1", huge)
	e.publishTriage("RHEL-2")

	heap0, rss0 := settledHeap(), procStatus(t, "VmRSS")
	var r runs
	e.start(ctx, routerOpts{}, func(msg *message.Message) error {
		r.Add(issueOf(msg))
		return nil
	})
	redistest.Eventually(t, 20*time.Second, func() bool { return r.Get("RHEL-2") == 1 && len(e.dead()) == 1 },
		"the next event runs and the huge one is dead-lettered (runs %v, dead %d)", r.Snapshot(), len(e.dead()))
	hwm := procStatus(t, "VmHWM")
	heap1, rss1 := settledHeap(), procStatus(t, "VmRSS")
	t.Logf("worker meeting a %d MiB entry: RSS %.1f MiB before, %.1f MiB after (peak of the process %.1f MiB); "+
		"heap after GC %.1f → %.1f MiB", huge>>20, mib(rss0), mib(rss1), mib(hwm), mib(int64(heap0)), mib(int64(heap1)))

	if r.Get("RHEL-1") != 0 {
		t.Fatal("the oversized event ran")
	}
	d := e.dead()[0]
	size := 0
	for k, v := range d.Values {
		size += len(k) + len(v.(string))
	}
	if size > event.MaxDeadCopyBytes+4<<10 {
		t.Fatalf("dead letter of %d bytes, want at most the 64 KiB copy and its bookkeeping", size)
	}
	if got, _ := strconv.Atoi(d.Values[event.DeadFieldSize].(string)); got < huge {
		t.Fatalf("dead_size %d, want the original size", got)
	}
	if reason := d.Values[event.DeadFieldError].(string); !strings.Contains(reason, "oversized entry") ||
		d.Values[event.DeadFieldID] != hugeID || d.Values["m:issue_key"] != "RHEL-1" ||
		!strings.HasPrefix(d.Values["payload"].(string), `{"metadata":{"issue":"RHEL-1"},"blob":"xxx`) {
		t.Fatalf("dead letter %v", trimValues(d.Values))
	}
	if left, _ := e.rdb.XRange(ctx, e.triage(), hugeID, hugeID).Result(); len(left) != 0 {
		t.Fatal("the oversized original is still in its stream")
	}
	if e.pending(e.triage()) != 0 {
		t.Fatal("entries left pending")
	}
	// Nothing keeps the entry: the heap after GC is back within a few MiB.
	if int64(heap1)-int64(heap0) > 8<<20 {
		t.Fatalf("heap grew by %.1f MiB after the entry was dead-lettered", mib(int64(heap1)-int64(heap0)))
	}
	// A truncated copy is never requeued.
	in, err := inspect.New(inspect.Config{Client: e.rdb, Topology: e.topo, Locker: e.locker(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	op := audit.WithOperator(ctx, audit.Operator{Who: "tester", Reason: "bounds test"}) // writes are audited
	if _, err := in.Requeue(op, d.ID); !errors.Is(err, event.ErrEventTooLarge) {
		t.Fatalf("requeue of a truncated copy: %v", err)
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

func trimValues(v map[string]any) map[string]any {
	out := map[string]any{}
	for k, x := range v {
		s := x.(string)
		if len(s) > 200 {
			s = s[:200] + "…"
		}
		out[k] = s
	}
	return out
}

// An entry with too many fields is dead-lettered too, and never run.
func TestTooManyFieldsDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	vals := map[string]any{"_watermill_message_uuid": "u1", "payload": `{"metadata":{"issue":"RHEL-3"}}`, "m:issue_key": "RHEL-3"}
	for i := range event.MaxEventFields {
		vals["m:f"+strconv.Itoa(i)] = "v"
	}
	if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: e.triage(), Values: vals}).Err(); err != nil {
		t.Fatal(err)
	}
	e.publishTriage("RHEL-4")
	var r runs
	e.start(ctx, routerOpts{}, func(msg *message.Message) error {
		r.Add(issueOf(msg))
		return nil
	})
	redistest.Eventually(t, 10*time.Second, func() bool { return r.Get("RHEL-4") == 1 && len(e.dead()) == 1 },
		"the next event runs and the wide one is dead-lettered")
	if r.Get("RHEL-3") != 0 || !strings.Contains(e.dead()[0].Values[event.DeadFieldError].(string), "259 fields") {
		t.Fatalf("runs %v, dead %v", r.Snapshot(), trimValues(e.dead()[0].Values))
	}
}
