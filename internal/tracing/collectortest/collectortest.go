// Package collectortest reads OTLP/HTTP trace exports as an OpenTelemetry collector
// does, for tests of the exporter and of the commands that trace. It imports the
// collector's service package (and gRPC with it): only tests may import it, which
// cmd/ymirflow's TestBinaryLeavesGRPCAndPrometheusOut holds.
package collectortest

import (
	"compress/gzip"
	"fmt"
	"io"
	"net/http"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Decode reads r's body (gzip or not) as an ExportTraceServiceRequest.
func Decode(r *http.Request) (*coltracepb.ExportTraceServiceRequest, error) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		z, err := gzip.NewReader(r.Body)
		if err != nil {
			return nil, fmt.Errorf("collectortest: gzip: %w", err)
		}
		body = z
	}
	b, err := io.ReadAll(body)
	if err != nil {
		return nil, fmt.Errorf("collectortest: reading the request: %w", err)
	}
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		return nil, fmt.Errorf("collectortest: a collector cannot read the request: %w", err)
	}
	return &req, nil
}

// Resource is rs's resource attributes with string values, by key.
func Resource(rs *tracepb.ResourceSpans) map[string]string {
	attrs := map[string]string{}
	for _, kv := range rs.GetResource().GetAttributes() {
		attrs[kv.GetKey()] = kv.GetValue().GetStringValue()
	}
	return attrs
}
