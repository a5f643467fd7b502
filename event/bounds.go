package event

import (
	"errors"
	"fmt"
	"sort"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Bounds of one stream entry. Agents and operators publish events; a runaway producer
// must not make every worker that reads its entry hold, decode, copy and retry megabytes.
const (
	// DefaultMaxEventBytes bounds the bytes of one entry: every field name and value.
	DefaultMaxEventBytes = 1 << 20
	// MaxEventFields bounds the fields of one entry (an event has about ten).
	MaxEventFields = 256
	// MaxDeadCopyBytes bounds the truncated copy of an oversized entry kept in the
	// dead-letter stream.
	MaxDeadCopyBytes = 64 << 10
)

// ErrEventTooLarge marks an event refused at publish for its size or field count.
var ErrEventTooLarge = errors.New("event too large")

// Metadata set on the message of an oversized entry (never written back as metadata).
const (
	metaSize   = "_ymir_size"   // the original entry's size in bytes
	metaFields = "_ymir_fields" // and its number of fields
)

func orMaxEventBytes(n int) int {
	if n <= 0 {
		return DefaultMaxEventBytes
	}
	return n
}

// entrySize is the bytes and fields of an entry's values, as go-redis returns them
// (string values) or as Encode builds them, without the fields the subscriber stamps.
func entrySize(values map[string]any) (n, fields int) {
	for k, v := range values {
		if len(k) > 6 && k[:6] == "_ymir_" {
			continue
		}
		fields++
		n += len(k)
		switch s := v.(type) {
		case string:
			n += len(s)
		case []byte:
			n += len(s)
		default:
			n += len(fmt.Sprint(s))
		}
	}
	return n, fields
}

// CheckEvent refuses values (stream fields about to be published) larger than maxBytes
// (0: DefaultMaxEventBytes) or with more than MaxEventFields fields, with an error
// wrapping ErrEventTooLarge that says by how much.
func CheckEvent(values map[string]any, maxBytes int) error {
	maxBytes = orMaxEventBytes(maxBytes)
	n, fields := entrySize(values)
	if fields > MaxEventFields {
		return fmt.Errorf("%w: %d fields, at most %d allowed", ErrEventTooLarge, fields, MaxEventFields)
	}
	if n > maxBytes {
		return fmt.Errorf("%w: %d bytes, at most %d allowed (MaxEventBytes)", ErrEventTooLarge, n, maxBytes)
	}
	return nil
}

// oversized builds the message of an entry too large to run: marked bad (so it is
// dead-lettered, never run) with a copy of at most MaxDeadCopyBytes: the uuid, the
// short metadata fields, and the head of the payload.
func oversized(values map[string]any, size, fields, maxBytes int) *message.Message {
	str := func(k string) string {
		s, _ := values[k].(string)
		return s
	}
	budget := MaxDeadCopyBytes
	take := func(s string, n int) string {
		n = max(0, min(n, budget, len(s)))
		budget -= n
		return s[:n]
	}
	uuid := take(str(fieldUUID), 128)
	if uuid == "" {
		uuid = str(fieldXID)
	}
	var keys []string
	for k := range values {
		if len(k) > len(metaPrefix) && k[:len(metaPrefix)] == metaPrefix && len(k) <= 128 && !internalMeta(k[len(metaPrefix):]) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	// Metadata first (it names the issue and the event), at most 1 KiB each and half the
	// budget in all; the payload's head gets the rest.
	md := message.Metadata{}
	for _, k := range keys {
		if len(md) >= 64 || budget-len(k) < MaxDeadCopyBytes/2 {
			break
		}
		budget -= len(k)
		md[k[len(metaPrefix):]] = take(str(k), 1024)
	}
	payload := take(str(fieldPayload), budget)
	msg := message.NewMessage(uuid, []byte(payload))
	msg.Metadata = md
	msg.Metadata.Set(fieldXID, str(fieldXID))
	msg.Metadata.Set(fieldStream, str(fieldStream))
	msg.Metadata.Set(fieldReadAt, str(fieldReadAt))
	msg.Metadata.Set(metaSize, strconv.Itoa(size))
	msg.Metadata.Set(metaFields, strconv.Itoa(fields))
	msg.Metadata.Set(metaBad, fmt.Sprintf("oversized entry: %d bytes in %d fields (at most %d bytes, MaxEventBytes, and %d fields); a truncated copy is kept",
		size, fields, maxBytes, MaxEventFields))
	return msg
}
