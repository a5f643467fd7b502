package lease_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

func BenchmarkAcquireRelease(b *testing.B) {
	rdb, ns := redistest.Client(b)
	var rt redistest.RoundTrips
	rdb.AddHook(&rt)
	l := newLocker(b, rdb, ns, lease.Options{})
	ctx := context.Background()
	// Warm the script cache so EVALSHA hits, as it does in a long-running worker.
	le, _ := l.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{})
	le.Release(ctx)
	rt.Reset()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		le, err := l.Acquire(ctx, "triage", "RHEL-"+strconv.Itoa(1+i%1000), lease.AcquireOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := le.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(rt.Count())/float64(b.N), "roundtrips/op")
}

func BenchmarkAcquireReleaseParallel(b *testing.B) {
	rdb, ns := redistest.Client(b)
	l := newLocker(b, rdb, ns, lease.Options{})
	ctx := context.Background()
	var seq atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			// Distinct keys: this measures throughput, not contention.
			le, err := l.Acquire(ctx, "triage", "RHEL-"+strconv.FormatInt(1+seq.Add(1), 10), lease.AcquireOptions{})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := le.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}
