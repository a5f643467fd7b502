package event

// Dead-letter entry fields, besides the original entry's own (uuid, payload, m:*).
const (
	DeadFieldStream   = "dead_stream"
	DeadFieldID       = "dead_id"
	DeadFieldError    = "dead_error"
	DeadFieldAttempts = "dead_attempts"
	DeadFieldAgent    = "dead_agent"
	DeadFieldAt       = "dead_at"
	// DeadFieldSize is the original size in bytes of an oversized entry, whose dead
	// letter holds a truncated copy (DeadFieldFields: its number of fields).
	DeadFieldSize   = "dead_size"
	DeadFieldFields = "dead_fields"
)
