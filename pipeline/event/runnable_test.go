package event_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/pipeline/event"
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
