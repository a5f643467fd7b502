package event_test

import (
	"fmt"
	"strings"

	"github.com/ymirflow/ymirflow/event"
)

// A triage request as `ymirflow enqueue --agent triage rhel-123` writes it: built,
// encoded into the fields of a stream entry, read back as a worker reads it, and
// validated for the triage agent, which canonicalises its issue key. A real worker
// passes the lease's canonicalisation (a Locker's Canonicalize method).
func ExampleValidate() {
	task, err := event.ParseTask([]byte(`{"metadata":{"issue":"rhel-123"},"extra":"kept"}`))
	if err != nil {
		panic(err)
	}
	msg, err := event.New(event.TriageRequested, "rhel-123", task, nil)
	if err != nil {
		panic(err)
	}
	fields := event.Encode(msg) // what an XADD of the event writes
	fmt.Println(fields[event.MetaPrefix+event.MetaEventType], fields[event.MetaPrefix+event.MetaSchemaVersion])

	read := event.DecodeEntry("ymir:triage", "1700000000000-0", fields)
	upper := func(raw string) (string, error) { return strings.ToUpper(strings.TrimSpace(raw)), nil }
	key, err := event.Validate(read, "triage", upper)
	fmt.Println(key, err, event.EntryID(read), string(read.Payload))

	_, err = event.Validate(read, "rebase", upper)
	fmt.Println(err)
	// Output:
	// triage.requested 1
	// RHEL-123 <nil> 1700000000000-0 {"attempts":0,"extra":"kept","metadata":{"issue":"rhel-123"},"user_triggered":false}
	// bad event: event_type "triage.requested" is not for agent rebase (want rebase.requested)
}
