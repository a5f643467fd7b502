package pipeline_test

import (
	"context"
	"hash/fnv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/pipeline"
)

// Two workers share a backlog of few issues: some runs fail once (nacked, handed over
// again or retried), some run past the offer-back time (the entries read ahead behind
// them are handed back, and the other worker claims them), the rest are quick, and
// events of a busy issue are dropped. Once every entry is handled, neither worker counts
// an entry as its own, in flight or queued (Router.Books).
func TestBooksBalanceOnceAllIsHandled(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	tries := map[string]int{}
	handler := func(msg *message.Message) error {
		id := event.EntryID(msg)
		mu.Lock()
		tries[id]++
		first := tries[id] == 1
		mu.Unlock()
		h := fnv.New32a()
		_, _ = h.Write([]byte(id))
		switch {
		case first && h.Sum32()%3 == 0:
			return errBoom
		case first && h.Sum32()%3 == 1:
			select {
			case <-time.After(1200 * time.Millisecond): // past the offer-back time
			case <-msg.Context().Done():
				return msg.Context().Err()
			}
		}
		return nil
	}
	var routers []*pipeline.Router
	for _, c := range []string{"w1", "w2"} {
		r, _ := e.start(ctx, routerOpts{Consumer: c, TTL: 900 * time.Millisecond, MaxIdle: 600 * time.Millisecond}, handler)
		routers = append(routers, r)
	}
	for i := range 40 {
		e.publishTriage([]string{"RHEL-1", "RHEL-2", "RHEL-3", "RHEL-4", "RHEL-5", "RHEL-6"}[i%6])
	}
	redistest.Eventually(t, 90*time.Second, e.allHandled, "every entry handled")
	for i, r := range routers {
		var in, q int
		if !redistest.Within(5*time.Second, func() bool { in, q = r.Books(); return in == 0 && q == 0 }) {
			t.Fatalf("worker %d: every entry handled, yet it counts %d in flight and %d queued", i+1, in, q)
		}
	}
}
