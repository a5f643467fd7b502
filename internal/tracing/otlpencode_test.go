package tracing

import (
	"bytes"
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// captured is an otlptrace.Client that keeps what the SDK's exporter converted.
type captured struct{ got []*tracepb.ResourceSpans }

func (c *captured) Start(context.Context) error { return nil }
func (c *captured) Stop(context.Context) error  { return nil }
func (c *captured) UploadTraces(_ context.Context, rs []*tracepb.ResourceSpans) error {
	c.got = rs
	return nil
}

// sdkRequest is the request the SDK's own OTLP exporter (otlptrace, its tracetransform)
// makes of spans: the reference encodeSpans is held to.
func sdkRequest(t *testing.T, spans []sdktrace.ReadOnlySpan) *coltracepb.ExportTraceServiceRequest {
	t.Helper()
	c := &captured{}
	exp, err := otlptrace.New(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if err := exp.ExportSpans(context.Background(), spans); err != nil {
		t.Fatal(err)
	}
	return &coltracepb.ExportTraceServiceRequest{ResourceSpans: c.got}
}

func ourRequest(t *testing.T, spans []sdktrace.ReadOnlySpan) *coltracepb.ExportTraceServiceRequest {
	t.Helper()
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(encodeSpans(spans), &req); err != nil {
		t.Fatalf("our request does not decode: %v", err)
	}
	return &req
}

// byResource orders a request's ResourceSpans by their resource: the SDK's exporter
// writes them in a map's order, ours in the order first met.
func byResource(req *coltracepb.ExportTraceServiceRequest) {
	key := func(rs *tracepb.ResourceSpans) []byte {
		b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(rs.GetResource())
		return b
	}
	slices.SortStableFunc(req.ResourceSpans, func(a, b *tracepb.ResourceSpans) int { return bytes.Compare(key(a), key(b)) })
}

// The request is the SDK's, message for message: every field of a span, its events and
// links, every attribute type (defaults included: false, 0, "", empty lists), status
// codes, kinds, remote parents, dropped counts, several resources and scopes. Spans are
// drawn at random from a fixed seed per round.
func TestEncodeSpansAsTheSDKDoes(t *testing.T) {
	t.Parallel()
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 36))
		var spans []sdktrace.ReadOnlySpan
		for range 1 + rng.IntN(6) {
			spans = append(spans, randomSpan(rng))
		}
		want, got := sdkRequest(t, spans), ourRequest(t, spans)
		byResource(want)
		byResource(got)
		if !proto.Equal(want, got) {
			t.Fatalf("seed %d: ours differs from the SDK's\nours: %v\nSDK:  %v", seed, got, want)
		}
	}
	if got := encodeSpans(nil); len(got) != 0 {
		t.Errorf("no spans: %x", got)
	}
}

func randomSpan(rng *rand.Rand) sdktrace.ReadOnlySpan {
	ids := func() (trace.TraceID, trace.SpanID) {
		var tid trace.TraceID
		var sid trace.SpanID
		for i := range tid {
			tid[i] = byte(rng.IntN(256))
		}
		for i := range sid {
			sid[i] = byte(rng.IntN(256))
		}
		return tid, sid
	}
	sc := func() trace.SpanContext {
		tid, sid := ids()
		cfg := trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.TraceFlags(rng.IntN(2)), Remote: rng.IntN(2) == 0}
		if rng.IntN(3) == 0 {
			cfg.TraceState, _ = trace.ParseTraceState("vendor=v" + strconv.Itoa(rng.IntN(9)))
		}
		return trace.NewSpanContext(cfg)
	}
	at := func() time.Time {
		if rng.IntN(8) == 0 {
			return time.Time{} // before 1970: sent as 0
		}
		return time.Unix(0, rng.Int64N(1<<62))
	}
	stub := tracetest.SpanStub{
		Name: []string{"", "process ymir:triage", "é ☃"}[rng.IntN(3)], SpanContext: sc(),
		SpanKind:  trace.SpanKind(rng.IntN(7)), // 6: not a kind, sent as unspecified
		StartTime: at(), EndTime: at(), Attributes: randomAttrs(rng, 3),
		Status:               sdktrace.Status{Code: codes.Code(rng.IntN(4)), Description: []string{"", "boom"}[rng.IntN(2)]},
		DroppedAttributes:    rng.IntN(3),
		DroppedEvents:        rng.IntN(3) - 1,
		DroppedLinks:         rng.IntN(3),
		ChildSpanCount:       rng.IntN(3),
		Resource:             []*resource.Resource{nil, resource.Empty(), resource.NewSchemaless(attribute.String("service.name", "a")), resource.NewWithAttributes("https://opentelemetry.io/schemas/1.37.0", attribute.String("service.name", "b"), attribute.Int("n", 2))}[rng.IntN(4)],
		InstrumentationScope: []instrumentation.Scope{{}, {Name: "ymirflow"}, {Name: "x", Version: "1.2", SchemaURL: "https://s", Attributes: attribute.NewSet(attribute.Bool("b", true))}}[rng.IntN(3)],
	}
	if rng.IntN(2) == 0 {
		stub.Parent = sc()
	}
	for range rng.IntN(3) {
		stub.Events = append(stub.Events, sdktrace.Event{Name: []string{"", "lease.taken"}[rng.IntN(2)], Time: at(),
			Attributes: randomAttrs(rng, 2), DroppedAttributeCount: rng.IntN(2)})
	}
	for range rng.IntN(3) {
		stub.Links = append(stub.Links, sdktrace.Link{SpanContext: sc(), Attributes: randomAttrs(rng, 2), DroppedAttributeCount: rng.IntN(2)})
	}
	return stub.Snapshot()
}

func randomAttrs(rng *rand.Rand, most int) []attribute.KeyValue {
	var kvs []attribute.KeyValue
	for i := range rng.IntN(most + 1) {
		kvs = append(kvs, attribute.KeyValue{Key: attribute.Key("k" + strconv.Itoa(i)), Value: randomValue(rng, 2)})
	}
	return kvs
}

func randomValue(rng *rand.Rand, depth int) attribute.Value {
	kinds := 11
	if depth == 0 {
		kinds = 9 // no nesting below
	}
	switch rng.IntN(kinds) {
	case 0:
		return attribute.BoolValue(rng.IntN(2) == 0)
	case 1:
		return attribute.Int64Value([]int64{0, -1, 1 << 40, -1 << 63}[rng.IntN(4)])
	case 2:
		return attribute.Float64Value([]float64{0, -2.5, 1e300}[rng.IntN(3)])
	case 3:
		return attribute.StringValue([]string{"", "RHEL-1", "a\x00b"}[rng.IntN(3)])
	case 4:
		return attribute.BoolSliceValue([]bool{false, true}[:rng.IntN(3)])
	case 5:
		return attribute.Int64SliceValue([]int64{0, -7}[:rng.IntN(3)])
	case 6:
		return attribute.Float64SliceValue([]float64{0, 0.5}[:rng.IntN(3)])
	case 7:
		return attribute.StringSliceValue([]string{"", "x"}[:rng.IntN(3)])
	case 8:
		return attribute.ByteSliceValue([]byte{0, 255}[:rng.IntN(3)])
	case 9:
		return attribute.SliceValue(randomValue(rng, depth-1), randomValue(rng, depth-1))
	default:
		return attribute.MapValue(attribute.KeyValue{Key: "m", Value: randomValue(rng, depth-1)})
	}
}
