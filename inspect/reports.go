package inspect

import "github.com/ymirflow/ymirflow/lockmw/lease"

// The documents printed by the CLI's --json and served by the console's /api/v1/:
// one struct per answer, so that both stay the same shape.

// LocksReport answers `locks` and GET /api/v1/leases.
type LocksReport struct {
	Leases []LeaseInfo `json:"leases"`
	// Slots are the concurrency limit keys in use (RUN_LIMITS).
	Slots []SlotInfo `json:"slots,omitempty"`
	// Pauses are the active pauses (ymirflow pause): no new run starts in them.
	Pauses []lease.Pause `json:"pauses,omitempty"`
}

// PendingReport answers `pending` and GET /api/v1/pending.
type PendingReport struct {
	Groups []GroupPending `json:"groups"`
}

// StreamsReport answers `streams` and GET /api/v1/streams.
type StreamsReport struct {
	Streams []StreamInfo `json:"streams"`
}

// HistoryReport answers `history KEY` and GET /api/v1/issues/{key}.
type HistoryReport struct {
	Issue  string         `json:"issue"`
	Events []HistoryEvent `json:"events"`
	// Indexed is how many events the per-issue index found.
	Indexed int `json:"indexed"`
	// Scanned, when set, says which entries older than the index were scanned.
	Scanned *HistoryScan `json:"scanned,omitempty"`
}

// DeadLettersReport answers `dlq list` and GET /api/v1/dead-letters.
type DeadLettersReport struct {
	DeadLetters []DeadLetter `json:"dead_letters"`
}

// RequeueReport answers `dlq requeue` and POST /api/v1/dead-letters/requeue: the
// entries moved, and one message per id that could not be.
type RequeueReport struct {
	Requeued []Requeued `json:"requeued"`
	Errors   []string   `json:"errors"`
}

// PurgeReport answers `dlq purge` and POST /api/v1/dead-letters/purge.
type PurgeReport struct {
	Purged int64 `json:"purged"`
}
