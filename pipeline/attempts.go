package pipeline

import (
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/event"
)

// countAttempts numbers the attempts of one delivery (metadata attempt, 1-based), so
// runners and dead letters can tell.
func countAttempts(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		n, _ := strconv.Atoi(msg.Metadata.Get(event.MetaAttempt))
		msg.Metadata.Set(event.MetaAttempt, strconv.Itoa(n+1))
		return h(msg)
	}
}
