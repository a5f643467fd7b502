package lease_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// BenchmarkHandoffBatchServer: what one event costs the Redis server in a batch of n
// (HandoffBatch ending n runs and taking n leases ahead, as a burst of quick events
// does), beside a batch of one, in one run: the server time of the script per event
// (from INFO commandstats, on a redis-server of its own) and the commands it runs per
// event. One op is one batch.
//
//	go test -run '^$' -bench HandoffBatchServer -benchtime 2000x ./lockmw/lease/
func BenchmarkHandoffBatchServer(b *testing.B) {
	for _, n := range []int{1, 8, 32} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			srv := redistest.StartServer(b, redistest.ServerOptions{})
			rdb := srv.Client()
			l, err := lease.New(rdb, lease.Options{})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			var ends []lease.End
			seq := 0
			batch := func() {
				nexts := make([]lease.Next, n)
				for i := range nexts {
					seq++
					nexts[i] = lease.Next{Agent: "triage", Key: "RHEL-" + strconv.Itoa(seq),
						Options: lease.AcquireOptions{Owner: "bench", MessageID: strconv.Itoa(seq) + "-0", Stream: "ymir:triage", EntryTime: time.Now()}}
				}
				ps, err := l.HandoffBatch(ctx, ends, nexts)
				if err != nil {
					b.Fatal(err)
				}
				ends = ends[:0]
				for _, p := range ps {
					le, err := p.Take(ctx)
					if err != nil {
						b.Fatal(err)
					}
					ends = append(ends, lease.End{Lease: le, Entry: lease.Entry{Stream: "triage", Group: "g", ID: p.MessageID()}, EndedAt: time.Now()})
				}
			}
			batch() // loads the script
			if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				batch()
			}
			b.StopTimer()
			usec, calls := scriptStats(ctx, b, rdb)
			events := float64(b.N * n)
			b.ReportMetric(usec*1000/events, "server-ns/event")
			b.ReportMetric(calls/events, "commands/event")
		})
	}
}

// scriptStats reads INFO commandstats: the server time of EVALSHA (µs) and the number of
// commands its scripts ran (every command but EVALSHA and CONFIG).
func scriptStats(ctx context.Context, b *testing.B, rdb *redis.Client) (usec, calls float64) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		name, stats, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		if !ok || name == line || strings.HasPrefix(name, "config") {
			continue
		}
		for _, f := range strings.Split(stats, ",") {
			k, v, _ := strings.Cut(f, "=")
			x, _ := strconv.ParseFloat(v, 64)
			switch {
			case name == "evalsha" && k == "usec":
				usec = x
			case name != "evalsha" && k == "calls":
				calls += x
			}
		}
	}
	return usec, calls
}
