package web_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// BenchmarkPages renders each page over streams holding 100 000 entries: 40 000 triage
// requests (1 000 of them pending), 20 000 rebase requests, 30 000 results records of
// the last hour, 10 000 dead letters, and 20 live leases. It reports the p50 and p95
// render time of each page (server side, the whole response):
//
//	go test -run '^$' -bench BenchmarkPages -benchtime 20x ./web/
func BenchmarkPages(b *testing.B) {
	e := newEnv(b, token)
	ctx := context.Background()
	fill(b, e)
	for _, p := range []string{"/", "/?fragment=1", "/leases", "/pending", "/issue?key=RHEL-1234", "/dead-letters",
		"/api/v1/overview", "/api/v1/pending"} {
		b.Run(p, func(b *testing.B) {
			var took []time.Duration
			for b.Loop() {
				rec := httptest.NewRecorder()
				req := httptest.NewRequestWithContext(ctx, "GET", p, nil)
				t0 := time.Now()
				e.srv.ServeHTTP(rec, req)
				took = append(took, time.Since(t0))
				if rec.Code != http.StatusOK {
					b.Fatalf("GET %s: %d %s", p, rec.Code, rec.Body.String())
				}
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(took[(len(took)*95+99)/100-1].Microseconds())/1000, "p95-ms")
		})
	}
}

// fill writes the benchmark's 100 000 entries, pipelined.
func fill(b *testing.B, e *env) {
	ctx := context.Background()
	triage, rebase := e.topo.Stream("triage", "", false), e.topo.Stream("rebase", "c9s", false)
	add := func(stream string, n int, values func(i int) (string, map[string]any)) {
		for off := 0; off < n; off += 1000 {
			pipe := e.rdb.Pipeline()
			for i := off; i < min(off+1000, n); i++ {
				id, v := values(i)
				pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: id, Values: v})
			}
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	request := func(key string) map[string]any {
		task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"` + key + `"}}`))
		msg, err := event.New(event.TriageRequested, key, task, nil)
		if err != nil {
			b.Fatal(err)
		}
		return event.Encode(msg)
	}
	add(triage, 40000, func(i int) (string, map[string]any) { return "*", request(fmt.Sprintf("RHEL-%d", 1+i%5000)) })
	add(rebase, 20000, func(i int) (string, map[string]any) { return "*", request(fmt.Sprintf("RHEL-%d", 1+i%5000)) })
	start := time.Now().Add(-59 * time.Minute).UnixMilli()
	add(e.topo.Results(), 30000, func(i int) (string, map[string]any) {
		return fmt.Sprintf("%d-%d", start+int64(i)*110, i), map[string]any{"event_type": []string{"stage.done", "stage.failed", "lock.dropped"}[i%3],
			"agent": "triage", "issue_key": fmt.Sprintf("RHEL-%d", 1+i%5000)}
	})
	add(e.topo.Dead(), 10000, func(i int) (string, map[string]any) {
		v := request(fmt.Sprintf("RHEL-%d", 1+i%5000))
		v[event.DeadFieldStream], v[event.DeadFieldID], v[event.DeadFieldError] = triage, "1-0", "agent failed 3 times"
		v[event.DeadFieldAttempts], v[event.DeadFieldAgent] = "3", "triage"
		return "*", v
	})
	if err := e.rdb.XGroupCreate(ctx, triage, "triage", "0").Err(); err != nil {
		b.Fatal(err)
	}
	if err := e.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "triage", Consumer: "w1", Streams: []string{triage, ">"}, Count: 1000}).Err(); err != nil {
		b.Fatal(err)
	}
	for i := range 20 {
		l, err := e.locker.Acquire(ctx, "triage", fmt.Sprintf("RHEL-%d", i+1), lease.AcquireOptions{Owner: "w1", MessageID: fmt.Sprintf("%d-0", i+1)})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _, _ = l.Release(context.Background()) })
	}
}
