package event

import (
	"github.com/ThreeDotsLabs/watermill/message"
)

// Field names of a stream entry (see Marshaller), for readers of raw entries such as
// the inspect package.
const (
	FieldUUID    = fieldUUID
	FieldPayload = fieldPayload
	// MetaPrefix prefixes the field of each metadata key: "m:issue_key".
	MetaPrefix = metaPrefix
)

// BadReason returns why DecodeEntry (or a Marshaller) could not decode an entry, or
// why it is too large to run ("" when it could and it is not).
func BadReason(msg *message.Message) string { return msg.Metadata.Get(metaBad) }

// Oversize returns the size in bytes and the number of fields of the entry behind an
// oversized message (one whose payload is a truncated copy); both are "" for any other.
func Oversize(msg *message.Message) (size, fields string) {
	return msg.Metadata.Get(metaSize), msg.Metadata.Get(metaFields)
}

// EntryIssue returns the raw issue key of a stream entry: the issue_key field
// (results records), the m:issue_key metadata, or the Task payload's key; "" when
// the entry names none.
func EntryIssue(stream, id string, values map[string]any) string {
	if s, _ := values["issue_key"].(string); s != "" {
		return s
	}
	if s, _ := values[metaPrefix+MetaIssueKey].(string); s != "" {
		return s
	}
	if _, ok := values[fieldPayload]; !ok {
		if _, ok := values[fieldMetadata]; !ok {
			return ""
		}
	}
	msg := DecodeEntry(stream, id, values)
	if k := msg.Metadata.Get(MetaIssueKey); k != "" {
		return k
	}
	if task, err := ParseTask(msg.Payload); err == nil {
		return task.IssueKey()
	}
	return ""
}
