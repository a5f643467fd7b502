package lease

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// Exclusion scopes: what a lease guards. Every lease holds its agent's own key
// (lock:<agent>:<ISSUE>, scope agent: the Python-compatible key, which also carries the
// agent's done record and coalesce queue). A lease may also hold shared keys, taken with
// it in one script, all or nothing, and released with it:
//
//   - scope issue, lock:@issue:<ISSUE>: one per issue across every agent that opts in,
//     so a rebase and a backport of one issue never run at once;
//   - scope group, lock:@group:<KEY>: a key taken from the event (field paths of its
//     JSON payload, or a producer's metadata), so that e.g. every clone of one package on
//     one branch is serialised whatever its issue.
//
// A shared key is a lease of its own in Redis (token, record, fence), so the operators'
// view, force releases and fenced checks treat it like any other. Keys are taken in a
// fixed order in one atomic script, never one by one, so two runs that want overlapping
// sets never wait on each other while holding a part: there is nothing to deadlock.

// Scope names what one lease key guards.
type Scope string

const (
	// ScopeAgent is one agent on one issue: lock:<agent>:<ISSUE>, always held.
	ScopeAgent Scope = "agent"
	// ScopeIssue is one issue across the agents that share it: lock:@issue:<ISSUE>.
	ScopeIssue Scope = "issue"
	// ScopeGroup is a key taken from the event: lock:@group:<KEY>.
	ScopeGroup Scope = "group"
)

// ScopeKey is one shared key of a lease: its scope (ScopeIssue or ScopeGroup) and its
// canonical key.
type ScopeKey struct {
	Scope Scope
	Key   string
}

// Scopes is what a handler's leases guard beyond the agent's own key (which is always
// held). The zero value is scope agent alone, today's lease.
type Scopes struct {
	// Issue adds the issue's shared key (ScopeIssue).
	Issue bool
	// Group, when not empty, adds a group key (ScopeGroup) made of these field paths of
	// the event, in order: "a.b.c" is a path into the JSON payload's objects, and
	// "m:<name>" a metadata value of the message (e.g. m:lock_key, a producer-supplied
	// key). Each value is canonicalised like an issue key (trimmed, uppercased) and
	// must match ^[A-Z0-9][A-Z0-9._+/@=~-]*$ (no ':', '|', braces, glob characters or
	// spaces); they are joined by '|'.
	Group []string
}

// groupPartPattern is what one canonical part of a group key looks like: a package, a
// branch, a component, a producer's key. No ':', '|', braces, glob characters or spaces:
// they separate or tag key names.
// Compiled on first use, not at start-up, where every command of the binary would pay for it.
var groupPartPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Z0-9][A-Z0-9._+/@=~-]*$`) })

// fieldPath is one step-separated path: identifiers of letters, digits, '_' and '-'.
var fieldPath = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`) })

// metaName is a metadata key a group path may name after "m:".
var metaName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9_.-]+$`) })

// ErrBadScope is wrapped by ParseScopes' errors.
var ErrBadScope = errors.New("lease: bad scope")

// ParseScopes parses a scope list: comma-separated items, each "agent", "issue" or
// "group:<path>[+<path>...]" (a path is a dotted field path of the event's JSON, or
// m:<metadata key>). "" is "agent". Items are put in the fixed order (agent, issue,
// group); at most one group. The error names the offending item, not a setting: the
// caller knows which setting it read.
func ParseScopes(s string) (Scopes, error) {
	var sc Scopes
	seen := map[string]bool{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, arg, hasArg := strings.Cut(item, ":")
		if seen[name] {
			return Scopes{}, fmt.Errorf("%w: %q given twice", ErrBadScope, name)
		}
		seen[name] = true
		switch {
		case name == string(ScopeAgent) && !hasArg:
		case name == string(ScopeIssue) && !hasArg:
			sc.Issue = true
		case name == string(ScopeGroup):
			if arg == "" {
				return Scopes{}, fmt.Errorf("%w: %q needs field paths: group:<path>[+<path>...], e.g. group:metadata.component+metadata.target_branch or group:m:lock_key", ErrBadScope, item)
			}
			for _, p := range strings.Split(arg, "+") {
				p = strings.TrimSpace(p)
				if err := checkPath(p); err != nil {
					return Scopes{}, fmt.Errorf("%w: %q: %w", ErrBadScope, item, err)
				}
				sc.Group = append(sc.Group, p)
			}
		default:
			return Scopes{}, fmt.Errorf("%w: %q is not agent, issue or group:<path>[+<path>...]", ErrBadScope, item)
		}
	}
	return sc, nil
}

func checkPath(p string) error {
	if m, ok := strings.CutPrefix(p, "m:"); ok {
		if !metaName().MatchString(m) {
			return fmt.Errorf("metadata name %q must be letters, digits, '_', '.' or '-'", m)
		}
		return nil
	}
	if !fieldPath().MatchString(p) {
		return fmt.Errorf("field path %q must be dot-separated names of letters, digits, '_' or '-'", p)
	}
	return nil
}

// String is the canonical form of s, which ParseScopes reads back.
func (s Scopes) String() string {
	parts := []string{string(ScopeAgent)}
	if s.Issue {
		parts = append(parts, string(ScopeIssue))
	}
	if len(s.Group) > 0 {
		parts = append(parts, string(ScopeGroup)+":"+strings.Join(s.Group, "+"))
	}
	return strings.Join(parts, ",")
}

// Shared reports whether s holds any shared key (anything beyond scope agent).
func (s Scopes) Shared() bool { return s.Issue || len(s.Group) > 0 }

// count is the number of shared keys a lease under s holds.
func (s Scopes) count() int {
	n := 0
	if s.Issue {
		n++
	}
	if len(s.Group) > 0 {
		n++
	}
	return n
}

// Keys returns the shared keys of an event under s, in the fixed order (issue, then
// group): issue is its canonical issue key, payload its JSON body (read only for group
// field paths), meta its metadata (for m: paths; may be nil). A missing, empty,
// non-scalar or invalid group value is an error wrapping ErrInvalidKey: the event cannot
// be locked and is a bad event.
func (s Scopes) Keys(issue string, payload []byte, meta func(string) string) ([]ScopeKey, error) {
	if !s.Shared() {
		return nil, nil
	}
	out := make([]ScopeKey, 0, s.count())
	if s.Issue {
		out = append(out, ScopeKey{Scope: ScopeIssue, Key: issue})
	}
	if len(s.Group) > 0 {
		var doc any
		parsed := false
		parts := make([]string, 0, len(s.Group))
		for _, p := range s.Group {
			var raw string
			if m, ok := strings.CutPrefix(p, "m:"); ok {
				if meta != nil {
					raw = meta(m)
				}
			} else {
				if !parsed {
					if err := json.Unmarshal(payload, &doc); err != nil {
						return nil, fmt.Errorf("%w: group key: payload is not JSON: %w", ErrInvalidKey, err)
					}
					parsed = true
				}
				v, err := lookupPath(doc, p)
				if err != nil {
					return nil, fmt.Errorf("%w: group key: %w", ErrInvalidKey, err)
				}
				raw = v
			}
			part, err := canonicalGroupPart(raw)
			if err != nil {
				return nil, fmt.Errorf("group key %s: %w", p, err)
			}
			parts = append(parts, part)
		}
		key := strings.Join(parts, "|")
		if len(key) > maxKeyLen {
			return nil, fmt.Errorf("%w: group key %q: %d characters (at most %d)", ErrInvalidKey, key, len(key), maxKeyLen)
		}
		out = append(out, ScopeKey{Scope: ScopeGroup, Key: key})
	}
	return out, nil
}

// canonicalGroupPart trims and uppercases one value of a group key and checks it
// against groupPartPattern.
func canonicalGroupPart(raw string) (string, error) {
	k := strings.ToUpper(strings.TrimSpace(raw))
	switch {
	case k == "":
		return "", fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(k) > maxKeyLen:
		return "", fmt.Errorf("%w: %d characters (at most %d)", ErrInvalidKey, len(k), maxKeyLen)
	case !groupPartPattern().MatchString(k):
		return "", fmt.Errorf("%w: %q does not match %s", ErrInvalidKey, k, groupPartPattern())
	}
	return k, nil
}

// lookupPath walks a dotted path of objects in doc to a string or number.
func lookupPath(doc any, path string) (string, error) {
	cur := doc
	for _, step := range strings.Split(path, ".") {
		obj, ok := cur.(map[string]any)
		if !ok {
			return "", fmt.Errorf("%s: %q is not inside an object", path, step)
		}
		if cur, ok = obj[step]; !ok {
			return "", fmt.Errorf("%s: no field %q", path, step)
		}
	}
	switch v := cur.(type) {
	case string:
		return v, nil
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), nil
	case json.Number:
		return v.String(), nil
	}
	return "", fmt.Errorf("%s: not a string or number (%T)", path, cur)
}

// sharedName is the agent-like part of a shared key's names ("@issue", "@group").
func sharedName(s Scope) string { return "@" + string(s) }

// SharedKeys returns the Redis keys of a shared key (Lock, Info and Fence; a shared key
// has no done record or queue of its own).
func (l *Locker) SharedKeys(sk ScopeKey) Keys {
	k := l.opts.Format.keysFor(l.opts.Scope+sharedName(sk.Scope), sk.Key, "")
	return Keys{Lock: k.Lock, Info: k.Info, Fence: k.Fence}
}

// scopedKeys returns the keys of the agent's own lease on issue when the lease also
// holds shared. They depend on the issue alone, never on the event's group: on
// standalone Redis, and for a group key on Redis Cluster, they are Keys(agent, issue);
// for the issue key on Redis Cluster they sit in its hash slot (named after the issue),
// so that one script can take both.
func (l *Locker) scopedKeys(agent, issue string, shared []ScopeKey) Keys {
	return l.opts.Format.keysFor(l.opts.Scope+agent, issue, l.clusterTag(shared))
}

// clusterTag is the hash tag the keys of a lease holding shared share on Cluster: the
// issue key's own name. "" on standalone, with no shared key, and for a group key,
// which apart takes in scripts of its own.
func (l *Locker) clusterTag(shared []ScopeKey) string {
	if l.opts.Format != KeysCluster || len(shared) == 0 || shared[0].Scope != ScopeIssue {
		return ""
	}
	return l.opts.Scope + sharedName(shared[0].Scope) + ":" + shared[0].Key
}

// apart reports whether the shared keys must be taken, extended and released in
// scripts of their own, beside the lease's: on Redis Cluster, a group key. Its name
// comes from the event's payload, and the agent's own keys must not depend on it (two
// events of one issue with two group values would get two lock keys and two fence
// counters, and run at once), so they cannot share its hash slot.
func (l *Locker) apart(shared []ScopeKey) bool {
	return l.opts.Format == KeysCluster && len(shared) > 0 && shared[0].Scope == ScopeGroup
}

// CheckScopes refuses scopes this Locker cannot take: on Redis Cluster a lease may hold
// at most one shared key (each is in its own hash slot: the agent's keys join the
// issue key's, and a group key is taken in a script of its own).
func (l *Locker) CheckScopes(s Scopes) error {
	if l.opts.Format == KeysCluster && s.count() > 1 {
		return fmt.Errorf("%w: %s: on Redis Cluster a lease holds at most one shared scope (issue or group), each in its own hash slot", ErrBadScope, s)
	}
	return nil
}
