package pipeline

import (
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/event"
)

// correlation gives every event a correlation id (kept across stages) before anything
// logs about it. As the first of our middlewares on the message's new goroutine, it
// also grows that goroutine's stack in one step (growStack).
func correlation(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		growStack(0)
		if msg.Metadata.Get(event.MetaCorrelationID) == "" {
			msg.Metadata.Set(event.MetaCorrelationID, watermill.NewUUID())
		}
		return h(msg)
	}
}
