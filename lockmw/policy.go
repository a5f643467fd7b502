package lockmw

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// Delay re-queues the event to run after a while: it is acked and kept in its
// stream's delayed set (internal/delayq) until due, then appended to the stream again by
// whichever worker of the stream promotes it (RunPromoter). Each further delay of the
// same event doubles, up to Rule.MaxDelay.
const Delay Policy = "delay"

// Delay bounds: a delay shorter than MinDelay would be a busy loop in all but name, one
// longer than MaxDelayCap is a lost event in all but name.
const (
	MinDelay    = 10 * time.Millisecond
	MaxDelayCap = 24 * time.Hour
)

// Wait puts the event in the key's line: it waits, FIFO, acked, and runs when the
// holder's release hands the key to it (lease.WaitOptions). With more than MaxWaiting
// in the line it is dead-lettered.
const Wait Policy = "wait"

// MaxWaitingCap bounds a wait rule's MAX.
const MaxWaitingCap = 100000

// Rule is the busy policy of one event type.
type Rule struct {
	Policy Policy
	// Delay is the first wait of policy Delay; MaxDelay caps its doubling (default 8
	// times Delay, at most MaxDelayCap).
	Delay, MaxDelay time.Duration
	// MaxWaiting bounds the line of policy Wait (default lease.DefaultLineMax).
	MaxWaiting int64
}

// String is the rule as ParsePolicies reads it.
func (r Rule) String() string {
	if r.Policy == Wait {
		if r.MaxWaiting == 0 || r.MaxWaiting == lease.DefaultLineMax {
			return string(Wait)
		}
		return fmt.Sprintf("wait:%d", r.MaxWaiting)
	}
	if r.Policy != Delay {
		return string(r.Policy)
	}
	if r.MaxDelay == defaultMaxDelay(r.Delay) {
		return fmt.Sprintf("delay:%s", r.Delay)
	}
	return fmt.Sprintf("delay:%s:%s", r.Delay, r.MaxDelay)
}

func defaultMaxDelay(d time.Duration) time.Duration { return min(8*d, MaxDelayCap) }

// wait is how long an event delayed n times before waits now: Delay doubled n times,
// capped at MaxDelay, plus up to a fifth more of jitter (never less: "after D" means
// at least D), so that events delayed together do not come back together.
func (r Rule) wait(n int) time.Duration {
	d := r.Delay
	for range min(n, 40) {
		if d >= r.MaxDelay {
			break
		}
		d *= 2
	}
	d = min(d, r.MaxDelay)
	return d + time.Duration(rand.Int64N(int64(d)/5+1))
}

// Policies is the busy policy per event type: ByType's rule for an event of that type
// (metadata event_type), else Default. The zero value is Drop for everything.
type Policies struct {
	Default Rule
	ByType  map[string]Rule
}

// For returns the rule for an event of eventType.
func (p Policies) For(eventType string) Rule {
	if r, ok := p.ByType[eventType]; ok {
		return r
	}
	return p.Default
}

// Uses reports whether any rule has one of policies.
func (p Policies) Uses(policies ...Policy) bool {
	if slices.Contains(policies, p.Default.Policy) {
		return true
	}
	for _, r := range p.ByType {
		if slices.Contains(policies, r.Policy) {
			return true
		}
	}
	return false
}

// only reports whether every rule has one of policies.
func (p Policies) only(policies ...Policy) bool {
	if !slices.Contains(policies, p.Default.Policy) {
		return false
	}
	for _, r := range p.ByType {
		if !slices.Contains(policies, r.Policy) {
			return false
		}
	}
	return true
}

// String is the table as ParsePolicies reads it, event types in order, the default last.
func (p Policies) String() string {
	types := make([]string, 0, len(p.ByType))
	for t := range p.ByType {
		types = append(types, t)
	}
	slices.Sort(types)
	parts := make([]string, 0, len(types)+1)
	for _, t := range types {
		parts = append(parts, t+"="+p.ByType[t].String())
	}
	def := p.Default
	if def.Policy == "" {
		def.Policy = Drop
	}
	if len(parts) == 0 {
		return def.String()
	}
	return strings.Join(append(parts, "*="+def.String()), ",")
}

// eventTypeName is what an event type in the table looks like (rebase.requested).
// Compiled on first use, not at start-up, where every command of the binary would pay for it.
var eventTypeName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]*$`) })

// check refuses a table built by hand with an unknown policy or a delay out of range,
// and gives a delay without a cap its default one.
func (p *Policies) check() error {
	fix := func(r *Rule) error {
		if r.Policy == Wait {
			if r.MaxWaiting == 0 {
				r.MaxWaiting = lease.DefaultLineMax
			}
			_, err := ParseRule(fmt.Sprintf("wait:%d", r.MaxWaiting))
			return err
		}
		if r.Policy != Delay {
			_, err := ParsePolicy(string(r.Policy))
			return err
		}
		if r.MaxDelay == 0 {
			r.MaxDelay = defaultMaxDelay(r.Delay)
		}
		_, err := ParseRule(fmt.Sprintf("delay:%s:%s", r.Delay, r.MaxDelay))
		return err
	}
	p.ByType = maps.Clone(p.ByType) // the caller's map stays as it was
	if err := fix(&p.Default); err != nil {
		return fmt.Errorf("lockmw: Config.Policies default: %w", err)
	}
	for t, r := range p.ByType {
		if err := fix(&r); err != nil {
			return fmt.Errorf("lockmw: Config.Policies %s: %w", t, err)
		}
		p.ByType[t] = r
	}
	return nil
}

// CheckTypes refuses a table that names an event type not in known: its rule would
// never apply, and a typo (comment.create=deliver) would leave the type it meant to
// the default rule without a word. The error names the field and lists known.
func (p Policies) CheckTypes(known []string) error {
	types := slices.Sorted(maps.Keys(p.ByType))
	for _, t := range types {
		if !slices.Contains(known, t) {
			return fmt.Errorf("lockmw: Config.Policies entry %q: %s is not an event type a worker runs: one of %s",
				t+"="+p.ByType[t].String(), t, strings.Join(known, ", "))
		}
	}
	return nil
}

// ParsePolicies parses a busy-policy table: comma-separated entries
// "<event type>=<rule>" and "*=<rule>" (every other type), where a rule is a policy
// ParsePolicy knows ("drop", "coalesce", ...), "delay:D" / "delay:D:MAX" (a Go
// duration, doubling up to MAX, by default 8×D) or "wait" / "wait:MAX" (at most MAX
// events wait in one key's line, by default lease.DefaultLineMax). A bare rule is the default, so "drop"
// and "coalesce" alone mean what they always meant; "" is drop. Example:
// "triage.requested=drop,rebase.requested=coalesce,*=delay:2m".
//
// Errors name the offending entry and the field (Config.Policies); the CLI adds its
// setting's name.
func ParsePolicies(s string) (Policies, error) {
	p := Policies{Default: Rule{Policy: Drop}}
	seenDefault := false
	for _, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		typ, spec, typed := strings.Cut(entry, "=")
		typ, spec = strings.TrimSpace(typ), strings.TrimSpace(spec)
		if !typed {
			typ, spec = "*", entry
		}
		if spec == "" {
			return Policies{}, fmt.Errorf("lockmw: Config.Policies entry %q: no rule after '='", entry)
		}
		r, err := ParseRule(spec)
		if err != nil {
			return Policies{}, fmt.Errorf("lockmw: Config.Policies entry %q: %w", entry, err)
		}
		switch {
		case typ == "*":
			if seenDefault {
				return Policies{}, fmt.Errorf("lockmw: Config.Policies entry %q: a second default (* or a bare rule)", entry)
			}
			seenDefault, p.Default = true, r
		case !eventTypeName().MatchString(typ):
			return Policies{}, fmt.Errorf("lockmw: Config.Policies entry %q: %q is not an event type (e.g. rebase.requested) or *", entry, typ)
		default:
			if _, dup := p.ByType[typ]; dup {
				return Policies{}, fmt.Errorf("lockmw: Config.Policies entry %q: %s given twice", entry, typ)
			}
			if p.ByType == nil {
				p.ByType = map[string]Rule{}
			}
			p.ByType[typ] = r
		}
	}
	return p, nil
}

// ParseRule parses one rule of the table: "delay:D[:MAX]", "wait[:MAX]", or a policy
// name (ParsePolicy).
func ParseRule(s string) (Rule, error) {
	if rest, ok := strings.CutPrefix(s, string(Wait)); ok && (rest == "" || rest[0] == ':') {
		return parseWait(strings.TrimPrefix(rest, ":"), rest != "")
	}
	if rest, ok := strings.CutPrefix(s, string(Delay)+":"); ok || s == string(Delay) {
		if !ok || rest == "" {
			return Rule{}, fmt.Errorf("delay needs a duration: delay:D or delay:D:MAX, e.g. delay:2m")
		}
		ds, maxs, hasMax := strings.Cut(rest, ":")
		d, err := time.ParseDuration(ds)
		if err != nil {
			return Rule{}, fmt.Errorf("delay %q: %w", ds, err)
		}
		if d < MinDelay || d > MaxDelayCap {
			return Rule{}, fmt.Errorf("delay %s must be from %s to %s", d, MinDelay, MaxDelayCap)
		}
		r := Rule{Policy: Delay, Delay: d, MaxDelay: defaultMaxDelay(d)}
		if hasMax {
			if r.MaxDelay, err = time.ParseDuration(maxs); err != nil {
				return Rule{}, fmt.Errorf("delay cap %q: %w", maxs, err)
			}
			if r.MaxDelay < d || r.MaxDelay > MaxDelayCap {
				return Rule{}, fmt.Errorf("delay cap %s must be from the delay %s to %s", r.MaxDelay, d, MaxDelayCap)
			}
		}
		return r, nil
	}
	pol, err := ParsePolicy(s)
	if err != nil {
		// ParsePolicy's message names its own field; in the table it names an entry.
		return Rule{}, fmt.Errorf("policy %s, or delay:D[:MAX]", strings.TrimPrefix(err.Error(), "lockmw: Config.Policy "))
	}
	return Rule{Policy: pol}, nil
}

// parseWait parses the MAX of "wait[:MAX]" (given: there was a ':').
func parseWait(maxs string, given bool) (Rule, error) {
	r := Rule{Policy: Wait, MaxWaiting: lease.DefaultLineMax}
	if !given {
		return r, nil
	}
	n, err := strconv.ParseInt(maxs, 10, 64)
	if err != nil || n < 1 || n > MaxWaitingCap {
		return Rule{}, fmt.Errorf("wait MAX %q must be a whole number from 1 to %d (the events that may wait for one key), e.g. wait:50", maxs, MaxWaitingCap)
	}
	r.MaxWaiting = n
	return r, nil
}
