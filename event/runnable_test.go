package event_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/event"
)

// FuzzRunnableAgreesWithValidate: the subscription's Peek decides whether an entry
// reaches the lease (no lease is taken ahead for one the dead-letter middleware takes)
// on its raw fields where it can. It must agree with the dead-letter middleware's own
// test, decode then Validate, for every entry.
func FuzzRunnableAgreesWithValidate(f *testing.F) {
	seeds := []string{
		"_watermill_message_uuid\x00u\x00payload\x00{\"metadata\":{\"issue\":\"RHEL-1\"}}\x00m:issue_key\x00RHEL-1",
		"_watermill_message_uuid\x00u\x00payload\x00{\"metadata\":{\"issue\":\"RHEL-1\"}}\x00m:issue_key\x00rhel-1 \x00m:schema_version\x001\x00m:event_type\x00triage.requested",
		"_watermill_message_uuid\x00u\x00payload\x00{\"metadata\":{\"issue\":\"RHEL-1\"}}\x00m:issue_key\x00RHEL-1\x00m:schema_version\x009",
		"_watermill_message_uuid\x00u\x00payload\x00{\"metadata\":{\"issue\":\"RHEL-1\"}}\x00m:issue_key\x00RHEL-1\x00m:event_type\x00rebase.requested",
		"_watermill_message_uuid\x00u\x00payload\x00{\"metadata\":{\"issue\":\"RHEL-1\"}}\x00m:issue_key\x00RHEL-1\x00m:event_type\x00comment.created\x00m:comment_id\x0010",
		"_watermill_message_uuid\x00u\x00payload\x00{\"metadata\":{\"issue\":\"RHEL-1\"}}\x00m:issue_key\x00RHEL-1\x00m:event_type\x00comment.updated",
		"_watermill_message_uuid\x00u\x00payload\x00{nope\x00m:issue_key\x00RHEL-1",
		"_watermill_message_uuid\x00u\x00payload\x00[1]\x00m:issue_key\x00RHEL-1",
		"_watermill_message_uuid\x00u\x00payload\x00{}\x00m:issue_key\x00../x",
		"payload\x00{}\x00m:issue_key\x00RHEL-1",
		"_watermill_message_uuid\x00u\x00m:issue_key\x00RHEL-1",
		"_watermill_message_uuid\x00u\x00payload\x00{\"metadata\":{\"issue\":\"RHEL-3\"}}",
		"_watermill_message_uuid\x00u\x00payload\x00{}\x00metadata\x00\x81\xa9issue_key\xa6RHEL-2",
		"_watermill_message_uuid\x00u\x00payload\x00{}\x00m:issue_key\x00RHEL-1\x00big\x00" + strings.Repeat("x", 2<<20),
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	for _, agent := range []string{"triage"} {
		check := event.Runnable(agent, canonical, 0)
		f.Fuzz(func(t *testing.T, in []byte) {
			v := map[string]any{}
			parts := bytes.Split(in, []byte{0})
			for i := 0; i+1 < len(parts); i += 2 {
				v[string(parts[i])] = string(parts[i+1])
			}
			msg, _ := event.Marshaller{}.Unmarshal(v)
			_, verr := event.Validate(msg, agent, canonical)
			if got, want := check(v), verr == nil; got != want {
				t.Fatalf("runnable = %v, Validate after decode = %v (%v) for %q", got, want, verr, v)
			}
		})
	}
}

// TestCommentCreatedIsForEveryAgent: a comment.created follow-up is published to
// whichever stage's run holds the issue, so every agent accepts it (Validate and the
// raw-field test Runnable agree), and no other foreign event type.
func TestCommentCreatedIsForEveryAgent(t *testing.T) {
	for _, agent := range event.Agents {
		for et, want := range map[string]bool{event.CommentCreated: true, event.RequestedEvent(agent): true,
			"comment.updated": false, "lock.dropped": false} {
			if got := event.Accepts(agent, et); got != want {
				t.Errorf("Accepts(%s, %s) = %v, want %v", agent, et, got, want)
			}
			msg, err := event.New(et, "rhel-7", event.Task{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			msg.Metadata.Set(event.MetaCommentID, "10")
			_, verr := event.Validate(msg, agent, canonical)
			if (verr == nil) != want {
				t.Errorf("Validate(%s, %s) = %v, want accepted %v", agent, et, verr, want)
			}
			fields := event.Encode(msg)
			if got := event.Runnable(agent, canonical, 0)(fields); got != want {
				t.Errorf("Runnable(%s, %s) = %v, want %v", agent, et, got, want)
			}
		}
	}
}
