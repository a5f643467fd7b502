package lease

import "context"

// MailboxFullError is mailboxFullError, for the tests of package lease_test.
type MailboxFullError = mailboxFullError

// MailboxDepth is mailboxDepth, for the tests of package lease_test.
func (l *Locker) MailboxDepth(ctx context.Context, agent, rawKey string) (int64, error) {
	return l.mailboxDepth(ctx, agent, rawKey)
}
