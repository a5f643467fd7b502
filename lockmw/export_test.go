package lockmw

import (
	"context"
	"time"

	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// SetBatchTiming sets batchQuick and batchFlushAfter for m: the model checker's runs
// end some steps after they start, never within 2 ms, and a longer flush lets its
// crashes land while ends wait for their batch. Call it before m handles anything.
func (m *Middleware) SetBatchTiming(quick, flushAfter time.Duration) {
	m.quick, m.flushAfter = quick, flushAfter
}

// BatchSend is a batch's round trip (lease.Locker.HandoffBatch).
type BatchSend = func(ctx context.Context, ends []lease.End, nexts []lease.Next) ([]*lease.Pending, error)

// WrapBatchSend wraps m's batch round trip: the model checker counts the batches, and
// its planted-defect tests send them wrongly. Call it before m handles anything.
func (m *Middleware) WrapBatchSend(wrap func(BatchSend) BatchSend) {
	m.sendBatch = wrap(m.sendBatch)
}

// SweepLines is one sweep of m's line waker (RunLineWaker), for the model checker,
// which ticks it as a step and once nothing else moves.
func (m *Middleware) SweepLines(ctx context.Context) error {
	_, err := m.sweepLines(ctx)
	return err
}
