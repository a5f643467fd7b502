package tracing

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// The OTLP/HTTP exporter is ours: the SDK's otlptracehttp imports gRPC through a
// configuration package it shares with the gRPC exporter
// (open-telemetry/opentelemetry-go#2579), and gRPC's package initialisation cost every
// command ≈ 6 ms of its start (issue 36); the request is encoded by otlpencode.go. It
// reads the same standard variables as otlptracehttp, sends the same request and
// retries as it does.

// Defaults of the exporter, as the SDK's.
const (
	defaultEndpoint = "http://localhost:4318/v1/traces"
	defaultTimeout  = 10 * time.Second
	// maxResponse bounds what is read of a collector's reply.
	maxResponse = 64 << 10
)

// retryPolicy is how an upload that met a busy collector is retried: the SDK's
// defaults (first wait 5 s, doubling to 30 s, giving up after a minute or the upload's
// timeout, whichever comes first); a Retry-After the collector sends is waited out.
type retryPolicy struct {
	first, max, total time.Duration
}

var defaultRetry = retryPolicy{first: 5 * time.Second, max: 30 * time.Second, total: time.Minute}

// otlpExporter is the span exporter (an sdktrace.SpanExporter, under the SDK's batcher)
// that posts OTLP/HTTP protobuf requests.
type otlpExporter struct {
	url     string
	headers http.Header
	gzip    bool
	timeout time.Duration
	retry   retryPolicy
	http    *http.Client
	// stop ends uploads still running when the exporter stops.
	stopped context.Context
	stop    context.CancelFunc
}

var _ sdktrace.SpanExporter = (*otlpExporter)(nil)

// newOTLPExporter is the exporter for c, with the exporter's standard variables looked up
// by getenv (OTEL_EXPORTER_OTLP_[TRACES_]HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE,
// _CLIENT_CERTIFICATE, _CLIENT_KEY, _PROTOCOL, and OTEL_EXPORTER_OTLP_TRACES_ENDPOINT when
// c.Endpoint is empty). A value it cannot use is an error naming the variable.
func newOTLPExporter(c Config, getenv func(string) string) (*otlpExporter, error) {
	env := otlpEnv{getenv}
	cl := &otlpExporter{url: defaultEndpoint, timeout: defaultTimeout, retry: defaultRetry, headers: http.Header{}}
	// The per-signal URL is used as is, and has no general form: the general one is
	// c.Endpoint, a base URL.
	switch u := getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"); {
	case c.Endpoint != "":
		cl.url = traceURL(c.Endpoint)
	case u != "":
		if err := checkURL(u); err != nil {
			return nil, fmt.Errorf("tracing: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: %w", err)
		}
		cl.url = u
	}
	steps := []func(otlpEnv) error{checkProtocol, cl.readHeaders, cl.readTimeout, cl.readCompression}
	for _, step := range steps {
		if err := step(env); err != nil {
			return nil, err
		}
	}
	tlsConf, err := env.tls()
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsConf
	cl.http = &http.Client{Transport: tr}
	cl.headers.Set("Content-Type", "application/x-protobuf")
	cl.headers.Set("User-Agent", "ymirflow OTLP exporter")
	if cl.gzip {
		cl.headers.Set("Content-Encoding", "gzip")
	}
	cl.stopped, cl.stop = context.WithCancel(context.Background())
	return cl, nil
}

// otlpEnv looks up OTEL_EXPORTER_OTLP_TRACES_<name>, then OTEL_EXPORTER_OTLP_<name>.
type otlpEnv struct{ getenv func(string) string }

// get returns the value that applies and the variable it came from.
func (e otlpEnv) get(name string) (string, string) {
	for _, v := range []string{"OTEL_EXPORTER_OTLP_TRACES_" + name, "OTEL_EXPORTER_OTLP_" + name} {
		if s := e.getenv(v); s != "" {
			return s, v
		}
	}
	return "", ""
}

// checkProtocol refuses gRPC, which this exporter does not speak: a deployment that
// sets it for all its services points the endpoint at a gRPC port, where every upload
// would fail. http/json is sent as http/protobuf: OTLP/HTTP receivers take both.
func checkProtocol(env otlpEnv) error {
	switch s, name := env.get("PROTOCOL"); s {
	case "", "http/protobuf", "http/json":
		return nil
	default:
		return fmt.Errorf("tracing: %s=%q: this exporter speaks OTLP over HTTP only (http/protobuf); "+
			"point the endpoint at the collector's OTLP/HTTP port (4318)", name, s)
	}
}

// readHeaders: comma-separated key=value pairs, values URL-encoded (as the SDK reads).
func (cl *otlpExporter) readHeaders(env otlpEnv) error {
	s, name := env.get("HEADERS")
	for _, pair := range strings.Split(s, ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		k = strings.TrimSpace(k)
		val, err := url.PathUnescape(v)
		if !ok || k == "" || err != nil {
			// The value may be a secret: name the key only.
			return fmt.Errorf("tracing: %s: %q is not key=value with a URL-encoded value", name, k)
		}
		cl.headers.Set(k, strings.TrimSpace(val))
	}
	return nil
}

// readTimeout: milliseconds, bounding one upload with its retries.
func (cl *otlpExporter) readTimeout(env otlpEnv) error {
	s, name := env.get("TIMEOUT")
	if s == "" {
		return nil
	}
	ms, err := strconv.Atoi(s)
	if err != nil || ms <= 0 {
		return fmt.Errorf("tracing: %s=%q: want a positive number of milliseconds", name, s)
	}
	cl.timeout = time.Duration(ms) * time.Millisecond
	return nil
}

func (cl *otlpExporter) readCompression(env otlpEnv) error {
	switch s, name := env.get("COMPRESSION"); s {
	case "", "none":
	case "gzip":
		cl.gzip = true
	default:
		return fmt.Errorf("tracing: %s=%q: want gzip or none", name, s)
	}
	return nil
}

// tls is the TLS configuration of the variables: a CA bundle for the collector's
// certificate, a client certificate and key; nil (the system's roots) when none is set.
func (e otlpEnv) tls() (*tls.Config, error) {
	ca, caName := e.get("CERTIFICATE")
	cert, certName := e.get("CLIENT_CERTIFICATE")
	key, keyName := e.get("CLIENT_KEY")
	if ca == "" && cert == "" && key == "" {
		return nil, nil
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("tracing: %s: %w", caName, err)
		}
		conf.RootCAs = x509.NewCertPool()
		if !conf.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tracing: %s=%q holds no PEM certificate", caName, ca)
		}
	}
	if (cert == "") != (key == "") {
		return nil, fmt.Errorf("tracing: %s: a client certificate and its key go together (OTEL_EXPORTER_OTLP_[TRACES_]CLIENT_CERTIFICATE and _CLIENT_KEY)", certName+keyName)
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("tracing: %s and %s: %w", certName, keyName, err)
		}
		conf.Certificates = []tls.Certificate{pair}
	}
	return conf, nil
}

// Shutdown ends the uploads still running and closes idle connections. It makes no
// connection before: the first upload does.
func (cl *otlpExporter) Shutdown(context.Context) error {
	cl.stop()
	cl.http.CloseIdleConnections()
	return nil
}

// ExportSpans posts spans as one ExportTraceServiceRequest (none: nothing is sent).
func (cl *otlpExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if len(spans) == 0 {
		return nil
	}
	body, err := cl.compress(encodeSpans(spans))
	if err == nil {
		err = cl.upload(ctx, body)
	}
	if err != nil {
		return fmt.Errorf("traces export: %w", err)
	}
	return nil
}

// upload posts body, retrying while the collector is busy (429, 502, 503, 504) or
// unreachable for a moment, within the timeout.
func (cl *otlpExporter) upload(ctx context.Context, body []byte) error {
	ctx, cancel := context.WithTimeout(ctx, cl.timeout)
	defer cancel()
	defer context.AfterFunc(cl.stopped, cancel)()
	start, wait := time.Now(), cl.retry.first
	var last error // the collector's last busy answer
	for {
		after, err := cl.post(ctx, body)
		var busy *busyError
		if !errors.As(err, &busy) {
			if last != nil && ctx.Err() != nil {
				// The time ran out during a retry: the busy answer says why.
				return fmt.Errorf("%w (then: %w)", last, err)
			}
			return err
		}
		last = err
		if after > wait {
			wait = after
		}
		if time.Since(start)+wait > cl.retry.total {
			return fmt.Errorf("%w (gave up after %s)", err, time.Since(start).Round(time.Millisecond))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (then: %w)", err, context.Cause(ctx))
		case <-t.C:
		}
		wait = min(2*wait, cl.retry.max)
	}
}

// compress is the request's body: b, gzipped if the variables ask for it.
func (cl *otlpExporter) compress(b []byte) ([]byte, error) {
	if !cl.gzip {
		return b, nil
	}
	var z bytes.Buffer
	w := gzip.NewWriter(&z)
	if _, err := w.Write(b); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return z.Bytes(), nil
}

// busyError is a failure worth retrying.
type busyError struct{ err error }

func (e *busyError) Error() string { return e.err.Error() }
func (e *busyError) Unwrap() error { return e.err }

// post sends body once. A busy collector's reply is a *busyError with the wait its
// Retry-After asks for.
func (cl *otlpExporter) post(ctx context.Context, body []byte) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cl.url, bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("tracing: %w", err)
	}
	req.Header = cl.headers.Clone()
	resp, err := cl.http.Do(req)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) && uerr.Temporary() && ctx.Err() == nil {
			return 0, &busyError{err: fmt.Errorf("tracing: %w", err)}
		}
		return 0, fmt.Errorf("tracing: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	reply, _ := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if resp.StatusCode/100 == 2 {
		return 0, partialSuccess(reply, resp.Header.Get("Content-Type"))
	}
	err = fmt.Errorf("tracing: the collector at %s answered %s: %s", cl.url, resp.Status, orEmpty(bytes.TrimSpace(reply)))
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return retryAfter(resp.Header.Get("Retry-After")), &busyError{err: err}
	}
	return 0, err
}

// partialSuccess reports the spans a collector accepted the request but rejected:
// ExportTraceServiceResponse's field 1, {1: rejected_spans, 2: error_message}.
func partialSuccess(reply []byte, contentType string) error {
	if len(reply) == 0 || contentType != "application/x-protobuf" {
		return nil
	}
	var ps []byte
	eachField(reply, func(num, wire int, v []byte, _ uint64) {
		if num == 1 && wire == wireBytes {
			ps = v
		}
	})
	rejected, msg := uint64(0), ""
	eachField(ps, func(num, wire int, v []byte, n uint64) {
		switch {
		case num == 1 && wire == wireVarint:
			rejected = n
		case num == 2 && wire == wireBytes:
			msg = string(v)
		}
	})
	if rejected == 0 && msg == "" {
		return nil
	}
	return fmt.Errorf("tracing: the collector rejected %d spans: %s", rejected, msg)
}

// eachField calls f with each field of message b: its number and wire type, and its
// value: the bytes of a length-delimited field, the number of a varint. Fixed-size
// fields are skipped over (the replies read here have none worth reading). It stops at
// the first malformed field or group (a reply that is not the expected message reports
// nothing).
func eachField(b []byte, f func(num, wire int, v []byte, n uint64)) {
	for len(b) > 0 {
		tag, k := binary.Uvarint(b)
		if k <= 0 || tag>>3 == 0 || tag>>3 > math.MaxInt32 {
			return
		}
		b = b[k:]
		num, wire := int(tag>>3), int(tag&7)
		var v []byte
		var n uint64
		switch wire {
		case wireVarint:
			if n, k = binary.Uvarint(b); k <= 0 {
				return
			}
		case wireFixed64:
			k = 8
		case wireFixed32:
			k = 4
		case wireBytes:
			l, m := binary.Uvarint(b)
			if m <= 0 || l > uint64(len(b)-m) {
				return
			}
			v, k = b[m:m+int(l)], m+int(l)
		default:
			return
		}
		if len(b) < k {
			return
		}
		f(num, wire, v, n)
		b = b[k:]
	}
}

// retryAfter is a Retry-After's wait in seconds or until its date; 0 when absent.
func retryAfter(v string) time.Duration {
	if s, err := strconv.Atoi(v); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

func orEmpty(b []byte) string {
	if len(b) == 0 {
		return "(empty body)"
	}
	if len(b) > 512 {
		b = b[:512]
	}
	return string(b)
}

// checkURL accepts an http:// or https:// URL with a host and no credentials.
func checkURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("want an http:// or https:// URL with a host")
	}
	if u.User != nil {
		return errors.New("must not carry credentials (the exporter's headers do)")
	}
	return nil
}
