package event

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/internal/streamid"
	"github.com/ymirflow/ymirflow/internal/xonce"
)

// Fencer is the lease a write runs under: Fence is the lease's fence number, and XAdd
// appends to a stream only while the lease is held (the lease library's Lease is one).
// The lock middleware puts the lease of the event being handled into the handler's
// context with WithFencer; Publisher and Results fence every write made under it.
type Fencer interface {
	Fence() int64
	XAdd(ctx context.Context, stream string, maxLen int64, values map[string]any) (string, error)
	// XAddOnce is XAdd under an append id the caller chose, remembered for ttl
	// (xonce.Append.ID): a second append with once adds nothing.
	XAddOnce(ctx context.Context, stream string, maxLen int64, once string, ttl time.Duration, values map[string]any) (string, error)
}

type fencerKey struct{}

// WithFencer returns ctx carrying f: writes of a Publisher or Results under the
// returned context are fenced by f.
func WithFencer(ctx context.Context, f Fencer) context.Context {
	return context.WithValue(ctx, fencerKey{}, f)
}

// FencerFrom returns the Fencer ctx carries, if any.
func FencerFrom(ctx context.Context) (Fencer, bool) {
	f, ok := ctx.Value(fencerKey{}).(Fencer)
	return f, ok && f != nil
}

// Publisher appends events to streams. It is safe for concurrent use and never closes
// the client it was given.
type Publisher struct {
	rdb      redis.UniversalClient
	maxLen   int64
	maxBytes int
	mu       sync.Mutex
	count    map[string]int64
	tracer   trace.Tracer // nil: no publish spans
}

// trimEvery is how many appends to one stream go between two Trim passes.
const trimEvery = 1000

// NewPublisher returns a publisher that keeps each stream near maxLen entries (0: never
// trim) with Trim, which never removes an entry a consumer group still needs.
func NewPublisher(rdb redis.UniversalClient, maxLen int64) *Publisher {
	return &Publisher{rdb: rdb, maxLen: maxLen, count: map[string]int64{}}
}

// WithMaxEventBytes sets the largest event p publishes (0: DefaultMaxEventBytes) and
// returns p. Workers dead-letter entries above their own MaxEventBytes unrun.
func (p *Publisher) WithMaxEventBytes(n int) *Publisher {
	p.maxBytes = n
	return p
}

// WithTracerProvider makes p trace each publish (a producer span whose context goes
// into the entry's traceparent) and returns p. Nil: no spans; an entry published
// under a span (ctx) still carries that span's traceparent.
func (p *Publisher) WithTracerProvider(tp trace.TracerProvider) *Publisher {
	p.tracer = Tracer(tp)
	return p
}

func (p *Publisher) maybeTrim(ctx context.Context, stream string) {
	if p.maxLen <= 0 {
		return
	}
	p.mu.Lock()
	p.count[stream]++
	due := p.count[stream]%trimEvery == 0
	p.mu.Unlock()
	if due {
		_, _ = Trim(ctx, p.rdb, stream, p.maxLen) // best effort: the next pass catches up
	}
}

// Publish implements Watermill's message.Publisher.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if _, err := p.PublishID(m.Context(), topic, m); err != nil {
			return err
		}
	}
	return nil
}

// PublishID appends msg to stream and returns its id. Under a lease (ctx from a lock
// middleware handler: FencerFrom) the append is fenced: refused once the lease is lost, and stamped
// with the lease's fence.
func (p *Publisher) PublishID(ctx context.Context, stream string, msg *message.Message) (id string, err error) {
	return p.publish(ctx, stream, msg, xonce.NewID(), retryOnceTTL)
}

// PublishOnce is PublishID for an event that names itself: an append with the same
// once id to the same stream within ttl (a webhook's redelivery of one Jira comment)
// adds nothing and returns the first append's entry id. Under a lease it is
// PublishID (the fenced append takes no once id).
func (p *Publisher) PublishOnce(ctx context.Context, stream string, msg *message.Message, once string, ttl time.Duration) (string, error) {
	if once == "" {
		return "", fmt.Errorf("publish %s to %s: empty once id", msg.Metadata.Get(MetaEventType), stream)
	}
	return p.publish(ctx, stream, msg, once, ttl)
}

func (p *Publisher) publish(ctx context.Context, stream string, msg *message.Message, once string, ttl time.Duration) (id string, err error) {
	lease, leased := FencerFrom(ctx)
	if leased {
		msg.Metadata.Set(MetaFence, strconv.FormatInt(lease.Fence(), 10))
	}
	if p.tracer != nil {
		var span trace.Span
		ctx, span = StartPublish(ctx, p.tracer, stream, msg)
		defer func() { EndPublish(span, id, err) }()
	}
	InjectTrace(ctx, msg)
	values := Encode(msg)
	if err := CheckEvent(values, p.maxBytes); err != nil {
		return "", fmt.Errorf("publish %s to %s refused: %w", msg.Metadata.Get(MetaEventType), stream, err)
	}
	// The append also lands in the issue's index (IndexIssue), in the same script; the
	// lease's fenced XADD takes the issue from ctx.
	ctx = xonce.WithIssue(ctx, IndexIssue(EntryIssue(stream, "", values)))
	if leased {
		id, err := lease.XAdd(ctx, stream, 0, values)
		if err != nil {
			return "", fmt.Errorf("publish %s to %s: %w", msg.Metadata.Get(MetaEventType), stream, err)
		}
		p.maybeTrim(ctx, stream)
		return id, nil
	}
	id, err = xonce.Run(ctx, p.rdb, xonce.Append{Stream: stream, ID: once, Values: values, TTL: ttl})
	if err != nil {
		return "", fmt.Errorf("publish %s to %s: %w", msg.Metadata.Get(MetaEventType), stream, err)
	}
	p.maybeTrim(ctx, stream)
	return id, nil
}

// Close implements message.Publisher; the client belongs to the caller.
func (p *Publisher) Close() error { return nil }

// retryOnceTTL is how long an append outside a lease is recognised if go-redis sends it
// again after a lost reply (its retries take about a second).
const retryOnceTTL = time.Minute

// Record is one line of the results stream.
type Record struct {
	ID            string // the record's stream id (set when read; ignored by Add)
	EventType     string // stage.done, stage.failed, ...
	Agent         string
	IssueKey      string
	MessageID     string // the stream entry the record is about
	Stream        string
	CorrelationID string
	Fence         string
	Outcome       string // e.g. the resolution or the label written
	Detail        string // JSON or free text
	TraceID       string // the trace the record was written in ("" untraced): the console links it
}

// Results appends records to the results stream.
type Results struct {
	rdb        redis.UniversalClient
	stream     string
	maxLen     int64
	redactor   *redact.Redactor
	outcomeTTL time.Duration
}

// defaultOutcomeTTL is how long AddOnce remembers which record an append id made. An
// event whose ack failed is redelivered within MaxIdleTime plus a claim pass while any
// worker of its agent runs; only an agent with no worker for this long sees its
// outcome forgotten (docs/architecture.md, "One outcome per event").
const defaultOutcomeTTL = 30 * 24 * time.Hour

// NewResults returns a writer of stream (Topology.Results()).
func NewResults(rdb redis.UniversalClient, stream string, maxLen int64) *Results {
	return &Results{rdb: rdb, stream: stream, maxLen: maxLen, outcomeTTL: defaultOutcomeTTL}
}

// WithRedactor makes r take secrets out of every record's text (outcome, detail) and
// returns r.
func (r *Results) WithRedactor(red *redact.Redactor) *Results {
	r.redactor = red
	return r
}

// Add appends r and returns its id. Under a lease (ctx from a lock middleware handler)
// the append is fenced like Publisher.PublishID: a holder that lost its lease cannot
// record an outcome, so the last outcome recorded for an issue is always a live
// holder's.
func (r *Results) Add(ctx context.Context, rec Record) (string, error) {
	return r.add(ctx, rec, "")
}

// AddOnce is Add for a record that names what it is about: once (the event's or the
// follow-up's own id) is its append id, remembered for the outcome TTL
// (defaultOutcomeTTL), so a second AddOnce with it, from this worker or any other, adds
// nothing and returns the first record's id. Recorded finds the record by once.
func (r *Results) AddOnce(ctx context.Context, rec Record, once string) (string, error) {
	if once == "" {
		return "", fmt.Errorf("record %s for %s: empty once id", rec.EventType, rec.IssueKey)
	}
	return r.add(ctx, rec, once)
}

func (r *Results) add(ctx context.Context, rec Record, once string) (string, error) {
	v := map[string]any{
		"event_type":     rec.EventType,
		"agent":          rec.Agent,
		"issue_key":      rec.IssueKey,
		"message_id":     rec.MessageID,
		"stream":         rec.Stream,
		"correlation_id": rec.CorrelationID,
		"fence":          rec.Fence,
		"outcome":        r.redactor.String(rec.Outcome),
		"detail":         r.redactor.String(rec.Detail),
		"at":             time.Now().UTC().Format(time.RFC3339Nano),
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		v["trace_id"] = sc.TraceID().String()
	}
	var id string
	var err error
	ctx = xonce.WithIssue(ctx, IndexIssue(rec.IssueKey))
	lease, leased := FencerFrom(ctx)
	switch {
	case leased && once != "":
		id, err = lease.XAddOnce(ctx, r.stream, r.maxLen, once, r.outcomeTTL, v)
	case leased:
		id, err = lease.XAdd(ctx, r.stream, r.maxLen, v)
	case once != "":
		id, err = xonce.Run(ctx, r.rdb, xonce.Append{Stream: r.stream, ID: once, Values: v, MaxLen: r.maxLen, TTL: r.outcomeTTL})
	default:
		id, err = xonce.Run(ctx, r.rdb, xonce.Append{Stream: r.stream, ID: xonce.NewID(), Values: v, MaxLen: r.maxLen, TTL: retryOnceTTL})
	}
	if err != nil {
		return "", fmt.Errorf("record %s for %s: %w", rec.EventType, rec.IssueKey, err)
	}
	return id, nil
}

// Recorded returns the record that AddOnce appended under once: found is false when
// none was (or its id is forgotten: the outcome TTL passed). It costs one round trip
// when nothing was recorded, two when something was. A record trimmed from the stream
// (MaxLen) is found with its ID only. A record gone from a stream that was not trimmed
// past it (a failover to a replica that had not received it loses the id with it; an
// operator's XDEL does not) is not found, and its id is forgotten, so that AddOnce
// records the outcome again.
func (r *Results) Recorded(ctx context.Context, once string) (rec Record, found bool, err error) {
	marker := xonce.MarkerKey(r.stream, once)
	id, err := r.rdb.Get(ctx, marker).Result()
	if errors.Is(err, redis.Nil) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("read the record of %s: %w", once, err)
	}
	pipe := r.rdb.Pipeline()
	own := pipe.XRange(ctx, r.stream, id, id)
	first := pipe.XRangeN(ctx, r.stream, "-", "+", 1)
	if _, err := pipe.Exec(ctx); err != nil {
		return Record{}, false, fmt.Errorf("read the record of %s: %w", once, err)
	}
	if msgs := own.Val(); len(msgs) == 1 {
		return recordOf(msgs[0]), true, nil
	}
	if f := first.Val(); len(f) == 1 && streamid.Compare(f[0].ID, id) > 0 {
		return Record{ID: id}, true, nil // trimmed: it was recorded
	}
	if err := r.rdb.Del(ctx, marker).Err(); err != nil {
		return Record{}, false, fmt.Errorf("forget the lost record of %s: %w", once, err)
	}
	return Record{}, false, nil
}

// Outcomes returns the issue's terminal records (stage.done, stage.failed), newest
// first, among the newest scan entries of the stream (0: 10 000). It reads backwards in
// pages, so an issue worked on recently costs one round trip.
func (r *Results) Outcomes(ctx context.Context, issue string, scan int) ([]Record, error) {
	if scan <= 0 {
		scan = 10_000
	}
	const page = 500
	var out []Record
	end := "+"
	for read := 0; read < scan; {
		msgs, err := r.rdb.XRevRangeN(ctx, r.stream, end, "-", page).Result()
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", r.stream, err)
		}
		for _, m := range msgs {
			if m.ID == end {
				continue
			}
			read++
			et, _ := m.Values["event_type"].(string)
			if key, _ := m.Values["issue_key"].(string); key != issue || (et != StageDone && et != StageFailed) {
				continue
			}
			out = append(out, recordOf(m))
		}
		if len(msgs) < page {
			break
		}
		end = msgs[len(msgs)-1].ID
	}
	return out, nil
}

func recordOf(m redis.XMessage) Record {
	s := func(k string) string { v, _ := m.Values[k].(string); return v }
	return Record{ID: m.ID, EventType: s("event_type"), Agent: s("agent"), IssueKey: s("issue_key"), MessageID: s("message_id"),
		Stream: s("stream"), CorrelationID: s("correlation_id"), Fence: s("fence"), Outcome: s("outcome"), Detail: s("detail"), TraceID: s("trace_id")}
}

// InvalidIssue is the index bucket (xonce.IndexKey) of entries whose issue key is not
// one: bad input never names a Redis key. Lower case, so no canonical key is it.
const InvalidIssue = "_invalid"

// maxIndexKey bounds the issue in an index key (the lease's own bound on a key).
const maxIndexKey = 100

// IndexIssue is the form of an issue key that the per-issue index of a stream files
// entries under (xonce.IndexKey): trimmed and upper-cased, as lease.Canonicalize makes
// it, when that is made of what a key may be made of (A-Z, 0-9, '_' and '-', at most
// 100 characters), else InvalidIssue; "" (no index) for an entry that names no issue.
// Where the lease's canonicalisation is at hand, IndexIssueOf checks the key itself.
// The result is a copy: a key read out of a huge entry would otherwise keep the whole
// entry's memory alive for as long as the client keeps the command's arguments.
func IndexIssue(raw string) string {
	k := strings.ToUpper(strings.TrimSpace(raw))
	if k == "" {
		return ""
	}
	if len(k) > maxIndexKey || strings.IndexFunc(k, notKeyRune) >= 0 {
		return InvalidIssue
	}
	return strings.Clone(k)
}

func notKeyRune(r rune) bool {
	return (r < 'A' || r > 'Z') && (r < '0' || r > '9') && r != '_' && r != '-'
}

// IndexIssueOf is IndexIssue for a raw key that nothing has validated yet (a bad
// event's, a dead letter's): the key canonical makes of it, InvalidIssue when canonical
// refuses it, "" for none.
func IndexIssueOf(raw string, canonical Canonical) string {
	if strings.TrimSpace(raw) == "" {
		return ""
	}
	k, err := canonical(raw)
	if err != nil {
		return InvalidIssue
	}
	return IndexIssue(k)
}

// RecordFor fills a record's identity from the message a handler is working on.
func RecordFor(msg *message.Message, agent, eventType string) Record {
	return Record{
		EventType:     eventType,
		Agent:         agent,
		IssueKey:      msg.Metadata.Get(MetaIssueKey),
		MessageID:     EntryID(msg),
		Stream:        EntryStream(msg),
		CorrelationID: msg.Metadata.Get(MetaCorrelationID),
		Fence:         msg.Metadata.Get(MetaFence),
	}
}
