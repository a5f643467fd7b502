package demo

import (
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/internal/progress"
	"github.com/ymirflow/ymirflow/event"
)

// StageStats is what happened at one stage (a consumer group: triage, rebase-c9s, ...);
// see progress.StageStats. Run, Retried and Running are the demo's handler counts.
type StageStats = progress.StageStats

// handlerCounts counts, per stage, the events that reached the handler, their attempts
// and the handlers at work. It wraps each worker's handler (inside the lock and the
// retries, so an attempt is one call).
type handlerCounts struct {
	mu      sync.Mutex
	seen    map[string]bool // stream|id of events that reached a handler
	run     map[string]int
	retried map[string]int
	running map[string]int
}

func newHandlerCounts() *handlerCounts {
	return &handlerCounts{seen: map[string]bool{}, run: map[string]int{}, retried: map[string]int{}, running: map[string]int{}}
}

func (c *handlerCounts) wrap(stageName string, h message.NoPublishHandlerFunc) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		id := event.EntryStream(msg) + "|" + event.EntryID(msg) + "|" + msg.UUID
		c.mu.Lock()
		if c.seen[id] {
			c.retried[stageName]++
		} else {
			c.seen[id] = true
			c.run[stageName]++
		}
		c.running[stageName]++
		c.mu.Unlock()
		defer func() {
			c.mu.Lock()
			c.running[stageName]--
			c.mu.Unlock()
		}()
		return h(msg)
	}
}

func (c *handlerCounts) fill(st *StageStats) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st.Run, st.Retried, st.Running = c.run[st.Stage], c.retried[st.Stage], c.running[st.Stage]
}
