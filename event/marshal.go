package event

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Stream entry layout. watermill-redisstream writes metadata as one msgpack blob,
// unreadable with redis-cli; we write one field per metadata key ("m:issue_key") and
// still read the msgpack form, so entries written by a stock Watermill publisher work.
const (
	fieldUUID     = "_watermill_message_uuid" // watermill-redisstream's UUIDHeaderKey
	fieldPayload  = "payload"
	fieldMetadata = "metadata"
	metaPrefix    = "m:"

	fieldXID    = FieldEntryID
	fieldStream = FieldEntryStream
	fieldReadAt = FieldReadAt

	// metaBad carries why an entry could not be decoded; the dead-letter middleware
	// takes such messages straight to the dead-letter stream.
	metaBad = "_ymir_bad"
)

// Fields a stream reader stamps into each entry's values as it reads it (the entry's
// id, its stream, and the read time in Unix nanoseconds); Unmarshal moves them into
// the message's metadata (EntryID, EntryStream, ReadAt). They are never written to a
// stream.
const (
	FieldEntryID     = "_ymir_xid"
	FieldEntryStream = "_ymir_stream"
	FieldReadAt      = "_ymir_read_at"
)

// Marshaller writes readable entries and reads both forms. Unmarshal never fails: a
// malformed entry becomes a message marked bad, which the dead-letter path takes
// (docs/architecture.md, "The read path"). So does an entry larger
// than MaxEventBytes (0: DefaultMaxEventBytes) or with more than MaxEventFields fields:
// its message holds a truncated copy of at most MaxDeadCopyBytes, never the whole.
type Marshaller struct {
	// MaxEventBytes bounds the bytes of an entry that is decoded whole (every field
	// name and value). Default: DefaultMaxEventBytes (1 MiB).
	MaxEventBytes int
}

// Marshal implements watermill-redisstream's Marshaller.
func (Marshaller) Marshal(_ string, msg *message.Message) (map[string]any, error) {
	return Encode(msg), nil
}

// Encode returns the stream fields of msg.
func Encode(msg *message.Message) map[string]any {
	v := map[string]any{fieldUUID: msg.UUID, fieldPayload: string(msg.Payload)}
	for k, val := range msg.Metadata {
		if strings.HasPrefix(k, "_ymir_") {
			continue
		}
		v[metaPrefix+k] = val
	}
	return v
}

// Unmarshal implements watermill-redisstream's Unmarshaller.
func (m Marshaller) Unmarshal(values map[string]any) (*message.Message, error) {
	limit := orMaxEventBytes(m.MaxEventBytes)
	if size, fields := entrySize(values); size > limit || fields > MaxEventFields {
		return oversized(values, size, fields, limit), nil
	}
	str := func(k string) string {
		if s, ok := values[k].(string); ok {
			return s
		}
		return ""
	}
	uuid := str(fieldUUID)
	var bad []string
	if uuid == "" {
		bad = append(bad, "no "+fieldUUID+" field")
		uuid = str(fieldXID)
	}
	if _, ok := values[fieldPayload]; !ok {
		bad = append(bad, "no payload field")
	}
	msg := message.NewMessage(uuid, []byte(str(fieldPayload)))
	if md := str(fieldMetadata); md != "" {
		var m message.Metadata
		if err := msgpackUnmarshal([]byte(md), &m); err != nil {
			bad = append(bad, fmt.Sprintf("metadata is not msgpack: %v", err))
		}
		for k, v := range m {
			if !internalMeta(k) {
				msg.Metadata.Set(k, v)
			}
		}
	}
	for k := range values {
		if name, ok := strings.CutPrefix(k, metaPrefix); ok && !internalMeta(name) {
			msg.Metadata.Set(name, str(k))
		}
	}
	msg.Metadata.Set(fieldXID, str(fieldXID))
	msg.Metadata.Set(fieldStream, str(fieldStream))
	msg.Metadata.Set(fieldReadAt, str(fieldReadAt))
	if len(bad) > 0 {
		sort.Strings(bad)
		msg.Metadata.Set(metaBad, "undecodable entry: "+strings.Join(bad, "; "))
	}
	return msg, nil
}

// internalMeta reports a metadata name of this process's own (_ymir_*): a stream entry
// must not set it (a forged m:_ymir_bad or m:_ymir_size would steer the dead-letter path).
func internalMeta(name string) bool { return strings.HasPrefix(name, "_ymir_") }

// EntryID is the stream id a message was read from ("" for a message not read from a
// stream).
func EntryID(msg *message.Message) string { return msg.Metadata.Get(fieldXID) }

// EntryStream is the stream a message was read from.
func EntryStream(msg *message.Message) string { return msg.Metadata.Get(fieldStream) }

// ReadAt is when a message's entry was read (FieldReadAt); ok is false for a message
// not read by a stamping reader.
func ReadAt(msg *message.Message) (at time.Time, ok bool) {
	ns, err := strconv.ParseInt(msg.Metadata.Get(fieldReadAt), 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(0, ns), true
}

// DecodeEntry turns a raw stream entry into a message (for inspection and replay).
func DecodeEntry(stream, id string, values map[string]any) *message.Message {
	vals := make(map[string]any, len(values)+2)
	for k, v := range values {
		vals[k] = v
	}
	vals[fieldXID], vals[fieldStream] = id, stream
	msg, _ := Marshaller{}.Unmarshal(vals)
	return msg
}
