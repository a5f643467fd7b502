package event_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/event"
)

// fields decodes a fuzz input into stream fields: NUL-separated name, value pairs.
func fields(b []byte) map[string]any {
	parts := bytes.Split(b, []byte{0})
	v := map[string]any{}
	for i := 0; i+1 < len(parts); i += 2 {
		v[string(parts[i])] = string(parts[i+1])
	}
	return v
}

// FuzzDecodeEntry: any stream entry decodes to a message without panicking; a message
// not marked bad survives an encode/decode round trip; an oversized one holds at most
// the 64 KiB copy.
func FuzzDecodeEntry(f *testing.F) {
	f.Add([]byte("_watermill_message_uuid\x00u1\x00payload\x00{\"metadata\":{\"issue\":\"RHEL-1\"}}\x00m:issue_key\x00RHEL-1"))
	f.Add([]byte("payload\x00{}\x00metadata\x00\x81\xa9issue_key\xa6RHEL-2"))
	f.Add([]byte("_watermill_message_uuid\x00u\x00metadata\x00\xc1"))
	f.Add([]byte("m:\x00x\x00m:_ymir_bad\x00forged\x00_ymir_xid\x001-1"))
	f.Add([]byte("_watermill_message_uuid\x00u3\x00payload\x00{}\x00m:_ymir_size\x0099\x00m:_ymir_bad\x00forged"))
	f.Fuzz(func(t *testing.T, in []byte) {
		v := fields(in)
		msg := event.DecodeEntry("s", "1-1", v)
		if msg == nil {
			t.Fatal("nil message")
		}
		if len(msg.Payload) > event.DefaultMaxEventBytes {
			t.Fatalf("payload of %d bytes kept", len(msg.Payload))
		}
		size := 0
		for k, x := range v {
			size += len(k) + len(x.(string))
		}
		if (size > event.DefaultMaxEventBytes || len(v) > event.MaxEventFields) && len(msg.Payload) > event.MaxDeadCopyBytes {
			t.Fatalf("oversized entry keeps %d bytes", len(msg.Payload))
		}
		// Internal metadata never comes from the stream.
		for k, val := range v {
			if name, ok := strings.CutPrefix(k, "m:_ymir_"); ok && msg.Metadata.Get("_ymir_"+name) == val.(string) && val.(string) != "" &&
				name != "xid" && name != "stream" && name != "read_at" {
				t.Fatalf("stream field %q set internal metadata", k)
			}
		}
		enc := event.Encode(msg)
		again := event.DecodeEntry("s", "1-1", enc)
		if !bytes.Equal(again.Payload, msg.Payload) || again.UUID != msg.UUID {
			t.Fatalf("round trip changed the message: %q/%q → %q/%q", msg.UUID, msg.Payload, again.UUID, again.Payload)
		}
		for k, val := range msg.Metadata {
			if strings.HasPrefix(k, "_ymir_") {
				continue
			}
			if again.Metadata.Get(k) != val {
				t.Fatalf("metadata %q: %q → %q", k, val, again.Metadata.Get(k))
			}
		}
	})
}
