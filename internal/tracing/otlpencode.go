package tracing

import (
	"encoding/binary"
	"math"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// The request is written here, field by field, as the OTLP protobuf schema numbers
// them (opentelemetry-proto, trace/v1, common/v1, resource/v1), the way the SDK's
// otlptrace exporter converts spans (its tracetransform package): that exporter and
// the generated protobuf types it converts into cost every command ≈ 1.3 ms of its
// start (their package initialisation registers descriptors), for spans only the
// long-running commands send. TestEncodeSpansAsTheSDKDoes holds the two equal.

// wire types of the protobuf encoding.
const (
	wireVarint  = 0
	wireFixed64 = 1
	wireBytes   = 2
	wireFixed32 = 5
)

// pb appends protobuf fields to a message. Fields at their default value are left out,
// as proto3 does, except where a caller says a field is present (oneof members).
type pb []byte

func (b pb) tag(num, wire int) pb { return binary.AppendUvarint(b, uint64(num)<<3|uint64(wire)) }

func (b pb) varint(num int, v uint64) pb {
	if v == 0 {
		return b
	}
	return binary.AppendUvarint(b.tag(num, wireVarint), v)
}

func (b pb) fixed64(num int, v uint64) pb {
	if v == 0 {
		return b
	}
	return binary.LittleEndian.AppendUint64(b.tag(num, wireFixed64), v)
}

func (b pb) fixed32(num int, v uint32) pb {
	if v == 0 {
		return b
	}
	return binary.LittleEndian.AppendUint32(b.tag(num, wireFixed32), v)
}

// bytes appends a length-delimited field, present even when empty (a message, a oneof
// member); str leaves an empty string out.
func (b pb) bytes(num int, v []byte) pb {
	return append(binary.AppendUvarint(b.tag(num, wireBytes), uint64(len(v))), v...)
}

func (b pb) str(num int, s string) pb {
	if s == "" {
		return b
	}
	return b.text(num, s)
}

// text appends a string field, present even when empty (a oneof member).
func (b pb) text(num int, s string) pb {
	return append(binary.AppendUvarint(b.tag(num, wireBytes), uint64(len(s))), s...)
}

// ExportTraceServiceRequest { repeated ResourceSpans resource_spans = 1; }
//
// encodeSpans groups spans by resource, then by instrumentation scope, each in the order
// first met.
func encodeSpans(spans []sdktrace.ReadOnlySpan) []byte {
	type group struct {
		res    *resource.Resource
		scopes []instrumentation.Scope
		spans  map[instrumentation.Scope][]sdktrace.ReadOnlySpan
	}
	var order []attribute.Distinct
	groups := map[attribute.Distinct]*group{}
	for _, s := range spans {
		if s == nil {
			continue
		}
		key := s.Resource().Equivalent()
		g, ok := groups[key]
		if !ok {
			g = &group{res: s.Resource(), spans: map[instrumentation.Scope][]sdktrace.ReadOnlySpan{}}
			groups[key] = g
			order = append(order, key)
		}
		scope := s.InstrumentationScope()
		if _, ok := g.spans[scope]; !ok {
			g.scopes = append(g.scopes, scope)
		}
		g.spans[scope] = append(g.spans[scope], s)
	}
	var req pb
	for _, key := range order {
		g := groups[key]
		// ResourceSpans { Resource resource = 1; repeated ScopeSpans scope_spans = 2; string schema_url = 3; }
		var rs pb
		if g.res != nil {
			rs = rs.bytes(1, pb(nil).keyValues(1, g.res.Attributes()))
		}
		for _, scope := range g.scopes {
			rs = rs.bytes(2, scopeSpans(scope, g.spans[scope]))
		}
		rs = rs.str(3, g.res.SchemaURL())
		req = req.bytes(1, rs)
	}
	return req
}

// ScopeSpans { InstrumentationScope scope = 1; repeated Span spans = 2; string schema_url = 3; }
// InstrumentationScope { string name = 1; string version = 2; repeated KeyValue attributes = 3; }
func scopeSpans(scope instrumentation.Scope, spans []sdktrace.ReadOnlySpan) pb {
	var b pb
	if scope != (instrumentation.Scope{}) {
		b = b.bytes(1, pb(nil).str(1, scope.Name).str(2, scope.Version).keyValues(3, scope.Attributes.ToSlice()))
	}
	for _, s := range spans {
		b = b.bytes(2, span(s))
	}
	return b.str(3, scope.SchemaURL)
}

// Span: trace_id 1, span_id 2, trace_state 3, parent_span_id 4, name 5, kind 6,
// start_time_unix_nano 7, end_time_unix_nano 8, attributes 9, dropped_attributes_count
// 10, events 11, dropped_events_count 12, links 13, dropped_links_count 14, status 15,
// flags 16.
func span(s sdktrace.ReadOnlySpan) pb {
	sc, parent := s.SpanContext(), s.Parent()
	tid, sid := sc.TraceID(), sc.SpanID()
	b := pb(nil).bytes(1, tid[:]).bytes(2, sid[:]).str(3, sc.TraceState().String())
	if psid := parent.SpanID(); psid.IsValid() {
		b = b.bytes(4, psid[:])
	}
	b = b.str(5, s.Name()).varint(6, spanKind(s.SpanKind())).
		fixed64(7, unixNano(s.StartTime().UnixNano())).fixed64(8, unixNano(s.EndTime().UnixNano())).
		keyValues(9, s.Attributes()).varint(10, clamp(s.DroppedAttributes()))
	for _, e := range s.Events() {
		// Event { fixed64 time_unix_nano = 1; string name = 2; repeated KeyValue attributes = 3; uint32 dropped_attributes_count = 4; }
		b = b.bytes(11, pb(nil).fixed64(1, unixNano(e.Time.UnixNano())).str(2, e.Name).
			keyValues(3, e.Attributes).varint(4, clamp(e.DroppedAttributeCount)))
	}
	b = b.varint(12, clamp(s.DroppedEvents()))
	for _, l := range s.Links() {
		// Link { trace_id 1; span_id 2; trace_state 3; attributes 4; dropped_attributes_count 5; fixed32 flags 6; }
		ltid, lsid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
		b = b.bytes(13, pb(nil).bytes(1, ltid[:]).bytes(2, lsid[:]).keyValues(4, l.Attributes).
			varint(5, clamp(l.DroppedAttributeCount)).fixed32(6, spanFlags(l.SpanContext.TraceFlags(), l.SpanContext)))
	}
	b = b.varint(14, clamp(s.DroppedLinks()))
	// Status { string message = 2; StatusCode code = 3; }: always present.
	st := s.Status()
	b = b.bytes(15, pb(nil).str(2, st.Description).varint(3, statusCode(st.Code)))
	return b.fixed32(16, spanFlags(sc.TraceFlags(), parent))
}

// spanKind is OTLP's SpanKind: the same numbers as the API's, unspecified otherwise.
func spanKind(k trace.SpanKind) uint64 {
	switch k {
	case trace.SpanKindInternal, trace.SpanKindServer, trace.SpanKindClient, trace.SpanKindProducer, trace.SpanKindConsumer:
		return uint64(k)
	}
	return 0
}

// statusCode is OTLP's StatusCode: 0 unset, 1 ok, 2 error.
func statusCode(c codes.Code) uint64 {
	switch c {
	case codes.Ok:
		return 1
	case codes.Error:
		return 2
	}
	return 0
}

// spanFlags are the W3C trace flags, with OTLP's "whether the parent is remote is
// known" bit (0x100) and that bit (0x200).
func spanFlags(tf trace.TraceFlags, parent trace.SpanContext) uint32 {
	f := uint32(tf) | 0x100
	if parent.IsRemote() {
		f |= 0x200
	}
	return f
}

func unixNano(ns int64) uint64 { return uint64(max(ns, 0)) }

func clamp(n int) uint64 { return uint64(min(max(n, 0), math.MaxUint32)) }

// keyValues appends each attribute as field num: KeyValue { string key = 1; AnyValue value = 2; }.
func (b pb) keyValues(num int, kvs []attribute.KeyValue) pb {
	for _, kv := range kvs {
		b = b.bytes(num, pb(nil).str(1, string(kv.Key)).bytes(2, anyValue(kv.Value)))
	}
	return b
}

// AnyValue { oneof: string 1, bool 2, int64 3, double 4, ArrayValue 5, KeyValueList 6,
// bytes 7 }: the member set is written even at its default (false, 0, ""). ArrayValue
// and KeyValueList hold their items as field 1.
func anyValue(v attribute.Value) pb {
	var b pb
	switch v.Type() {
	case attribute.BOOL:
		b = binary.AppendUvarint(b.tag(2, wireVarint), boolBit(v.AsBool()))
	case attribute.INT64:
		b = binary.AppendUvarint(b.tag(3, wireVarint), uint64(v.AsInt64()))
	case attribute.FLOAT64:
		b = binary.LittleEndian.AppendUint64(b.tag(4, wireFixed64), math.Float64bits(v.AsFloat64()))
	case attribute.STRING:
		b = b.text(1, v.AsString())
	case attribute.BYTESLICE:
		b = b.bytes(7, v.AsByteSlice())
	case attribute.MAP:
		b = b.bytes(6, pb(nil).keyValues(1, v.AsMap()))
	case attribute.BOOLSLICE:
		b = b.bytes(5, array(v.AsBoolSlice(), attribute.BoolValue))
	case attribute.INT64SLICE:
		b = b.bytes(5, array(v.AsInt64Slice(), attribute.Int64Value))
	case attribute.FLOAT64SLICE:
		b = b.bytes(5, array(v.AsFloat64Slice(), attribute.Float64Value))
	case attribute.STRINGSLICE:
		b = b.bytes(5, array(v.AsStringSlice(), attribute.StringValue))
	case attribute.SLICE:
		b = b.bytes(5, array(v.AsSlice(), func(v attribute.Value) attribute.Value { return v }))
	case attribute.EMPTY:
	default:
		b = b.text(1, "INVALID")
	}
	return b
}

func array[T any](items []T, value func(T) attribute.Value) pb {
	var b pb
	for _, it := range items {
		b = b.bytes(1, anyValue(value(it)))
	}
	return b
}

func boolBit(v bool) uint64 {
	if v {
		return 1
	}
	return 0
}
