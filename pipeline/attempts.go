package pipeline

import (
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
)

// countAttempts numbers the attempts of one delivery (metadata attempt, 1-based), so
// runners and dead letters can tell.
func countAttempts(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		n, _ := strconv.Atoi(msg.Metadata.Get(MetaAttempt))
		msg.Metadata.Set(MetaAttempt, strconv.Itoa(n+1))
		return h(msg)
	}
}
