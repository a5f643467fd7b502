package collectortest_test

import (
	"bytes"
	"fmt"
	"net/http/httptest"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/ymirflow/ymirflow/internal/tracing/collectortest"
)

// A fake collector's handler decodes what the exporter posted.
func Example() {
	sent := &coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		Resource: &resourcepb.Resource{Attributes: []*commonpb.KeyValue{{Key: "service.name",
			Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: "ymirflow"}}}}},
		ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{{Name: "process ymir:triage"}}}},
	}}}
	body, _ := proto.Marshal(sent)
	req, err := collectortest.Decode(httptest.NewRequest("POST", "/v1/traces", bytes.NewReader(body)))
	if err != nil {
		fmt.Println(err)
		return
	}
	rs := req.GetResourceSpans()[0]
	fmt.Println(collectortest.Resource(rs)["service.name"], rs.GetScopeSpans()[0].GetSpans()[0].GetName())
	// Output: ymirflow process ymir:triage
}
