package pipeline

import "github.com/ymirflow/ymirflow/event"

import "github.com/ThreeDotsLabs/watermill/message"

// newDelivery restarts the attempt count: a nacked message comes back as a copy with
// its metadata, and each delivery gets MaxRetries attempts under its own lease.
func newDelivery(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		msg.Metadata.Set(event.MetaAttempt, "0")
		return h(msg)
	}
}
