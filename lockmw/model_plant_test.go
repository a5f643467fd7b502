package lockmw_test

// Planted defects in the batched ends (batch.go), as lockmw/lease's plant tests do for
// the Lua: each subtest sends the batches of the workers that read ahead wrongly
// (lockmw.Middleware.WrapBatchSend) and requires TestModelMiddleware's checker, on
// its read-ahead seeds of the default range, to fail. A checker that passes the real
// batches and fails each of these explores them.

import (
	"context"
	"testing"

	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

func TestModelMiddlewareCatchesBatchPlants(t *testing.T) {
	plants := []struct {
		name  string
		plant func(lockmw.BatchSend) lockmw.BatchSend
	}{
		// The ends' entries are settled (the subscriber sends no XACK) but the batch
		// acks none of them: released, never acked.
		{"settled, never acked", func(send lockmw.BatchSend) lockmw.BatchSend {
			return func(ctx context.Context, ends []lease.End, nexts []lease.Next) ([]*lease.Pending, error) {
				ends = append([]lease.End(nil), ends...)
				for i := range ends {
					ends[i].Entry.ID = "0-1" // acks no entry
				}
				return send(ctx, ends, nexts)
			}
		}},
		// Of the ends sent together, only the last one goes out: the ends that waited
		// for the batch (only those are ever sent two or more at once) are lost.
		{"waiting ends lost", func(send lockmw.BatchSend) lockmw.BatchSend {
			return func(ctx context.Context, ends []lease.End, nexts []lease.Next) ([]*lease.Pending, error) {
				if len(ends) > 1 {
					ends = ends[len(ends)-1:]
				}
				return send(ctx, ends, nexts)
			}
		}},
		// Not caught, and so not here: the nexts' acquires sent before the ends'
		// releases. A next entry of an issue whose run ends in the batch then meets that
		// run's lease and is dropped as locked, where the right order drops it as
		// superseded (it entered before the run ended): one record either way, which
		// the model's properties do not tell apart.
	}
	for _, p := range plants {
		t.Run(p.name, func(t *testing.T) {
			e := newMWEnv(t)
			e.plant = p.plant
			from, n := modelRange(48)
			for seed := from; seed < from+n; seed++ {
				cfg, steps := mwSeed(seed)
				if !cfg.readahead {
					continue
				}
				if err := e.run(cfg, steps); err != nil {
					t.Logf("caught at seed %d (%s): %v", seed, cfg, err)
					return
				}
			}
			t.Fatalf("the model checker passed %d seeds with the batches planted %q", n, p.name)
		})
	}
}
