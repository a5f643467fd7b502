package inspect_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/xonce"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// fillLua appends ARGV[2] entries to KEYS[1] as the pipeline's writers do (XADD, then
// the entry's id in its issue's index with its TTL, the index's start), about 5 000
// issues, every ARGV[3]th entry about ARGV[4]. ARGV[1] is the offset of the first
// entry's number. The index keys are built here, as xonce.IndexKey builds them (the
// benchmark runs on a standalone server of its own).
const fillLua = `
local stream, n, every, issue, off = KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[1])
local tag = '{' .. stream .. '}'
for i = off, off + n - 1 do
  local key = 'NOISE-' .. (i % 5000 + 1)
  if i % every == 0 then key = issue end
  local id = redis.call('XADD', stream, '*', 'event_type', 'stage.done', 'agent', 'triage', 'issue_key', key,
    'fence', '7', 'correlation_id', '5b0c5d0e-8f3b-4d7e-9a39-1f7f4f8c2d10', 'outcome', 'rebase')
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  local idx = tag .. ':issue:' .. key
  redis.call('ZADD', idx, ms, ms .. '-' .. string.format('%010d', tonumber(seq)))
  redis.call('PEXPIRE', idx, ARGV[5])
  redis.call('SET', tag .. ':issue-index-since', id, 'NX')
end
return redis.call('XLEN', stream)
`

// BenchmarkTimeline reads one issue's timeline (Inspector.Timeline: `history`, the
// console's issue page, /api/v1/issues/KEY) with 10 000 and with 1 000 000 entries in the
// streams (half in the results stream, a quarter in the triage stream, the rest in the
// four rebase and backport streams and the dead letters), 40 of them about the issue,
// spread over all of it. Each size runs on a Redis server of its own. It reports the p50
// and p95 of one call, and the memory the server holds per entry:
//
//	go test -run '^$' -bench BenchmarkTimeline -benchtime 200x ./inspect/
func BenchmarkTimeline(b *testing.B) {
	for _, n := range []int{10_000, 1_000_000} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			srv := redistest.StartServer(b, redistest.ServerOptions{})
			rdb := srv.Client()
			ctx := context.Background()
			topo := event.Topology{Namespace: "bench"}
			before := usedMemory(b, rdb)
			t0 := time.Now()
			fillTimeline(b, rdb, topo, n)
			fillTook := time.Since(t0)
			perEntry := float64(usedMemory(b, rdb)-before) / float64(n)
			locker, err := lease.New(rdb, lease.Options{})
			if err != nil {
				b.Fatal(err)
			}
			in, err := inspect.New(inspect.Config{Client: rdb, Topology: topo, Locker: locker})
			if err != nil {
				b.Fatal(err)
			}
			var took []time.Duration
			for b.Loop() {
				t0 := time.Now()
				rep, err := in.Timeline(ctx, "RHEL-1")
				took = append(took, time.Since(t0))
				if err != nil || len(rep.Events) != 40 || rep.Scanned != nil {
					b.Fatalf("timeline: %d events, scanned %v, %v", len(rep.Events), rep.Scanned, err)
				}
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(took[(len(took)*95+99)/100-1].Microseconds())/1000, "p95-ms")
			b.ReportMetric(perEntry, "mem-B/entry")
			b.Logf("%d entries written in %s", n, fillTook.Round(time.Millisecond))
		})
	}
}

func fillTimeline(b *testing.B, rdb *redis.Client, topo event.Topology, n int) {
	ctx := context.Background()
	shares := []struct {
		stream string
		part   int // of 20
	}{
		{topo.Results(), 10}, {topo.Stream("triage", "", false), 5}, {topo.Stream("rebase", "c9s", false), 1},
		{topo.Stream("rebase", "c10s", false), 1}, {topo.Stream("backport", "c9s", false), 1},
		{topo.Stream("backport", "c10s", false), 1}, {topo.Dead(), 1},
	}
	script := redis.NewScript(fillLua)
	for _, s := range shares {
		total := n * s.part / 20
		every := max(total/(40*s.part/20), 1) // 40 entries about RHEL-1 in all, by share
		for off := 0; off < total; off += 50_000 {
			k := min(50_000, total-off)
			if err := script.Run(ctx, rdb, []string{s.stream}, off, k, every, "RHEL-1", xonce.IndexTTL.Milliseconds()).Err(); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func usedMemory(b *testing.B, rdb *redis.Client) int64 {
	var m int64
	info := rdb.Info(context.Background(), "memory").Val()
	if _, err := fmt.Sscanf(info[indexOf(info, "used_memory:"):], "used_memory:%d", &m); err != nil {
		b.Fatal(err)
	}
	return m
}

func indexOf(s, sub string) int { return strings.Index(s, sub) }
