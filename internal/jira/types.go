package jira

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// TimeLayout is the layout Jira uses for timestamps, e.g. 2024-05-01T10:20:30.000+0000 (the
// offset has no colon). Time.MarshalJSON writes it.
const TimeLayout = "2006-01-02T15:04:05.000-0700"

// parseLayouts are tried in order by ParseTime. When parsing, Go accepts a fractional second
// after the seconds even if the layout has none, so ".000" and ".123456" both parse.
var parseLayouts = []struct {
	layout string
	naive  bool
}{
	{"2006-01-02T15:04:05Z0700", false},  // Jira: +0000, -0530, or Z
	{"2006-01-02T15:04:05Z07:00", false}, // RFC 3339
	{"2006-01-02T15:04:05", true},        // naive: read as UTC
	{"2006-01-02 15:04:05", true},
	{"2006-01-02", true},
}

// ParseTime parses a Jira timestamp. It accepts Jira's own form with an offset without colon
// (2024-05-01T10:20:30.000+0000), RFC 3339 (…Z or …+02:00), and naive timestamps without an
// offset (2024-05-01T10:20:30.000), which are read as UTC, as the Python system did.
func ParseTime(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, fmt.Errorf("jira: parse time: empty string")
	}
	for _, l := range parseLayouts {
		var (
			t   time.Time
			err error
		)
		if l.naive {
			t, err = time.ParseInLocation(l.layout, s, time.UTC)
		} else {
			t, err = time.Parse(l.layout, s)
		}
		if err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("jira: parse time %q: not a Jira timestamp", s)
}

// Time is a time.Time that reads and writes Jira's timestamp format (see ParseTime). JSON null
// and "" decode to the zero Time; the zero Time encodes as null.
type Time struct {
	time.Time
}

// UnmarshalJSON implements json.Unmarshaler using ParseTime.
func (t *Time) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		t.Time = time.Time{}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("jira: time must be a JSON string: %w", err)
	}
	if s == "" {
		t.Time = time.Time{}
		return nil
	}
	v, err := ParseTime(s)
	if err != nil {
		return err
	}
	t.Time = v
	return nil
}

// MarshalJSON implements json.Marshaler, writing TimeLayout (or null for the zero Time).
func (t Time) MarshalJSON() ([]byte, error) {
	if t.IsZero() {
		return []byte("null"), nil
	}
	return json.Marshal(t.Format(TimeLayout))
}

// Status is an issue's workflow status.
type Status struct {
	ID   string `json:"id,omitempty"`
	Name string `json:"name"`
}

// Named is anything Jira represents as an object with an id and a name (components, versions).
type Named struct {
	ID   string `json:"id,omitempty"`
	Name string `json:"name"`
}

// User is a Jira user. Jira Cloud identifies users by AccountID; Jira Server/DC by Name
// (the username) and Key.
type User struct {
	AccountID    string `json:"accountId,omitempty"`
	Name         string `json:"name,omitempty"`
	Key          string `json:"key,omitempty"`
	DisplayName  string `json:"displayName,omitempty"`
	EmailAddress string `json:"emailAddress,omitempty"`
}

// ID returns the identifier that UserGroups expects: the AccountID on Jira Cloud, else the
// username.
func (u User) ID() string {
	if u.AccountID != "" {
		return u.AccountID
	}
	return u.Name
}

// Issue is one Jira issue. Fields holds the typed fields ymirflow uses plus every field as raw
// JSON; Raw is the whole issue object as received (nil for issues built in Go).
type Issue struct {
	ID     string          `json:"id,omitempty"`
	Key    string          `json:"key"`
	Self   string          `json:"self,omitempty"`
	Fields Fields          `json:"fields"`
	Raw    json.RawMessage `json:"-"`
}

// UnmarshalJSON decodes an issue and keeps a copy of the whole object in Raw.
func (i *Issue) UnmarshalJSON(b []byte) error {
	type plain Issue
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*i = Issue(p)
	i.Raw = append(json.RawMessage(nil), b...)
	return nil
}

// Fields is the typed subset of an issue's fields. Raw holds every field of the issue as
// received, including custom fields such as customfield_10669; use Field to decode one.
type Fields struct {
	Summary     string   `json:"summary,omitempty"`
	Labels      []string `json:"labels"`
	Status      Status   `json:"status"`
	Updated     Time     `json:"updated"`
	Created     Time     `json:"created"`
	Components  []Named  `json:"components"`
	FixVersions []Named  `json:"fixVersions"`

	Raw map[string]json.RawMessage `json:"-"`
}

// typedFieldNames are the JSON names of the typed members of Fields.
var typedFieldNames = []string{"summary", "labels", "status", "updated", "created", "components", "fixVersions"}

// UnmarshalJSON decodes the typed fields and keeps every field in Raw.
func (f *Fields) UnmarshalJSON(b []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	type plain struct {
		Summary     *string  `json:"summary"`
		Labels      []string `json:"labels"`
		Status      *Status  `json:"status"`
		Updated     Time     `json:"updated"`
		Created     Time     `json:"created"`
		Components  []Named  `json:"components"`
		FixVersions []Named  `json:"fixVersions"`
	}
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*f = Fields{
		Labels:      p.Labels,
		Updated:     p.Updated,
		Created:     p.Created,
		Components:  p.Components,
		FixVersions: p.FixVersions,
		Raw:         raw,
	}
	if p.Summary != nil {
		f.Summary = *p.Summary
	}
	if p.Status != nil {
		f.Status = *p.Status
	}
	return nil
}

// MarshalJSON writes Raw with the typed fields laid over it. A typed field is written when it
// is set or when Raw had it, so fields never seen stay absent.
func (f Fields) MarshalJSON() ([]byte, error) {
	out := make(map[string]json.RawMessage, len(f.Raw)+len(typedFieldNames))
	for k, v := range f.Raw {
		out[k] = v
	}
	put := func(name string, set bool, v any) error {
		if _, had := f.Raw[name]; !set && !had {
			return nil
		}
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("jira: encode field %s: %w", name, err)
		}
		out[name] = b
		return nil
	}
	labels := f.Labels
	if labels == nil {
		labels = []string{}
	}
	for _, e := range []struct {
		name string
		set  bool
		v    any
	}{
		{"summary", f.Summary != "", f.Summary},
		{"labels", f.Labels != nil, labels},
		{"status", f.Status != (Status{}), f.Status},
		{"updated", !f.Updated.IsZero(), f.Updated},
		{"created", !f.Created.IsZero(), f.Created},
		{"components", f.Components != nil, f.Components},
		{"fixVersions", f.FixVersions != nil, f.FixVersions},
	} {
		if err := put(e.name, e.set, e.v); err != nil {
			return nil, err
		}
	}
	return json.Marshal(out)
}

// Field decodes the raw field name (e.g. "customfield_10669") into v. It reports false when the
// field is absent or null.
func (f Fields) Field(name string, v any) (bool, error) {
	b, ok := f.Raw[name]
	if !ok || bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		return false, nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("jira: decode field %s: %w", name, err)
	}
	return true, nil
}

// HasLabel reports whether the issue carries label.
func (i Issue) HasLabel(label string) bool {
	for _, l := range i.Fields.Labels {
		if l == label {
			return true
		}
	}
	return false
}

// ChangelogEntry is one history record of an issue: who changed what, when.
type ChangelogEntry struct {
	ID      string       `json:"id"`
	Author  User         `json:"author"`
	Created Time         `json:"created"`
	Items   []ChangeItem `json:"items"`
}

// ChangeItem is one field change inside a ChangelogEntry. For labels, FromString and ToString
// are the space-separated label sets before and after.
type ChangeItem struct {
	Field      string `json:"field"`
	FieldType  string `json:"fieldtype,omitempty"`
	From       string `json:"from,omitempty"`
	FromString string `json:"fromString,omitempty"`
	To         string `json:"to,omitempty"`
	ToString   string `json:"toString,omitempty"`
}

// AddedLabels returns the labels this item added (in ToString, not in FromString); nil for an
// item that is not a labels change.
func (it ChangeItem) AddedLabels() []string {
	if !strings.EqualFold(it.Field, "labels") {
		return nil
	}
	return setDiff(strings.Fields(it.ToString), strings.Fields(it.FromString))
}

// RemovedLabels returns the labels this item removed (in FromString, not in ToString).
func (it ChangeItem) RemovedLabels() []string {
	if !strings.EqualFold(it.Field, "labels") {
		return nil
	}
	return setDiff(strings.Fields(it.FromString), strings.Fields(it.ToString))
}

// AddsLabel reports whether any item of the entry added label.
func (e ChangelogEntry) AddsLabel(label string) bool {
	for _, it := range e.Items {
		for _, l := range it.AddedLabels() {
			if l == label {
				return true
			}
		}
	}
	return false
}

// setDiff returns the members of a that are not in b, in a's order, without duplicates.
func setDiff(a, b []string) []string {
	in := make(map[string]bool, len(b))
	for _, s := range b {
		in[s] = true
	}
	var out []string
	for _, s := range a {
		if !in[s] {
			out = append(out, s)
			in[s] = true
		}
	}
	return out
}
