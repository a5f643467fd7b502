package lease

import (
	"fmt"
	"regexp"
	"strings"
)

// DefaultKeyPattern is what a canonical Jira issue key looks like: project, dash, number.
var DefaultKeyPattern = regexp.MustCompile(`^[A-Z][A-Z0-9_]*-[1-9][0-9]*$`)

// maxKeyLen bounds a canonical key. Jira project keys are short; anything longer is a
// payload bug, not an issue.
const maxKeyLen = 100

// Canonicalize trims and uppercases raw and checks it against pattern (DefaultKeyPattern
// when nil). The Python lock only uppercased; trimming closes the " rhel-1" vs "RHEL-1"
// split-brain found in its review.
func Canonicalize(raw string, pattern *regexp.Regexp) (string, error) {
	if pattern == nil {
		pattern = DefaultKeyPattern
	}
	k := strings.ToUpper(strings.TrimSpace(raw))
	if k == "" {
		return "", fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if len(k) > maxKeyLen {
		return "", fmt.Errorf("%w: %d characters (at most %d)", ErrInvalidKey, len(k), maxKeyLen)
	}
	if !matches(pattern, k) {
		return "", fmt.Errorf("%w: %q does not match %s", ErrInvalidKey, k, pattern)
	}
	return k, nil
}

// matches is pattern.MatchString(k), without the regexp engine for DefaultKeyPattern:
// this runs several times per event.
func matches(pattern *regexp.Regexp, k string) bool {
	if pattern != DefaultKeyPattern {
		return pattern.MatchString(k)
	}
	dash := strings.IndexByte(k, '-')
	if dash < 1 || dash == len(k)-1 || k[0] < 'A' || k[0] > 'Z' || k[dash+1] == '0' {
		return false
	}
	for i := 1; i < dash; i++ {
		if c := k[i]; (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	for i := dash + 1; i < len(k); i++ {
		if k[i] < '0' || k[i] > '9' {
			return false
		}
	}
	return true
}

// KeyFormat lays out the Redis keys of one lease.
type KeyFormat int

const (
	// KeysCompat uses lock:<agent>:<KEY>, the Python agents' key, so both can run side by
	// side during a migration. Its companion keys live under other prefixes so that a
	// Python fetcher's SCAN of lock:<agent>:* still finds only lock keys.
	KeysCompat KeyFormat = iota
	// KeysCluster puts every key of one lease in one hash slot ({<agent>:<KEY>}), so the
	// acquire, extend and release scripts are legal on Redis Cluster.
	KeysCluster
)

// Keys are the Redis keys of one lease.
type Keys struct {
	Lock  string // string: the holder's token (what the Python agents SET NX)
	Info  string // hash: owner, fence, acquired_at, message_id; same TTL as Lock
	Fence string // counter: never expires, so fences only grow
	Queue string // hash: the coalesce policy's one queued follow-up event
	Done  string // string "<ms> <message id>": the last release, for superseded events
	// Mailbox is a stream: the deliver policy's follow-ups for the run holding the
	// lease, bounded, emptied as runs account for them. Mailbox+":seen" (a set, same
	// hash slot) remembers which events were appended, so a repeat appends nothing.
	Mailbox string
	// Stop is a hash: the runs this lease's holders superseded (policy supersede) that
	// have not stopped yet, token -> "<deadline_ms> <newer message id> <new fence>"; the
	// newer run waits until it is empty (a field past its deadline counts as stopped).
	Stop string
}

// keyPrefixes are the prefixes of Keys' names, in field order.
var keyPrefixes = [...]string{"lock:", "lockinfo:", "lockfence:", "lockqueue:", "lockdone:", "lockmail:", "lockstop:"}

// keysFor returns the keys of the lease (agent, canonical issue key). The five names are
// slices of one string: one allocation per lease instead of five. On KeysCluster the
// hash tag is {<agent>:<KEY>}, or, for a lease that also holds a shared key, that key's
// name ({<tag>}<agent>:<KEY>: every key of the lease in the shared key's slot).
func (f KeyFormat) keysFor(agent, issue, tag string) Keys {
	open, end := "", ""
	if f == KeysCluster {
		open, end = "{", "}"
		if tag != "" {
			open, end = "{"+tag+"}", ""
		}
	}
	var b strings.Builder
	b.Grow(len("lock:lockinfo:lockfence:lockqueue:lockdone:lockmail:lockstop:") + len(keyPrefixes)*(len(open)+len(agent)+1+len(issue)+len(end)))
	var ends [len(keyPrefixes)]int
	for i, p := range keyPrefixes {
		b.WriteString(p)
		b.WriteString(open)
		b.WriteString(agent)
		b.WriteByte(':')
		b.WriteString(issue)
		b.WriteString(end)
		ends[i] = b.Len()
	}
	s := b.String()
	return Keys{Lock: s[:ends[0]], Info: s[ends[0]:ends[1]], Fence: s[ends[1]:ends[2]], Queue: s[ends[2]:ends[3]], Done: s[ends[3]:ends[4]],
		Mailbox: s[ends[4]:ends[5]], Stop: s[ends[5]:]}
}

// lockKey is keysFor(agent, issue).Lock, built alone: lookups of many lease keys (the
// fetcher's pre-check) need only this name.
func (f KeyFormat) lockKey(agent, issue string) string {
	if f == KeysCluster {
		return "lock:{" + agent + ":" + issue + "}"
	}
	return "lock:" + agent + ":" + issue
}

// infoPattern is the SCAN pattern that finds the info hashes of every live lease under
// prefix (Options.Scope): agents' own and shared keys, on Cluster also those tagged by a
// shared key. The agent is known only once parsed (a shared key's holder only once
// read), so callers filter after.
func (f KeyFormat) infoPattern(prefix string) string {
	if f == KeysCluster {
		return "lockinfo:{" + prefix + "*"
	}
	return "lockinfo:" + prefix + "*"
}

// parseInfoKey recovers (agent, issue) from an info key; for a shared key, agent is
// "@issue" or "@group" (after the prefix) and issue its key.
func (f KeyFormat) parseInfoKey(key string) (agent, issue string, ok bool) {
	rest, found := strings.CutPrefix(key, "lockinfo:")
	if !found {
		return "", "", false
	}
	if f == KeysCluster {
		tag, after, closed := strings.Cut(strings.TrimPrefix(rest, "{"), "}")
		if !closed {
			return "", "", false
		}
		rest = tag
		if after != "" { // {<shared key>}<agent>:<KEY>
			rest = after
		}
	}
	i := strings.LastIndex(rest, ":")
	if i <= 0 {
		return "", "", false
	}
	return rest[:i], rest[i+1:], true
}
