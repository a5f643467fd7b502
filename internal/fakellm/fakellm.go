// Package fakellm is a fake LLM endpoint for tests and the agent kit's examples: each
// call costs a fixed amount, takes a set time and is counted, so a test knows exactly
// what agents spent whatever ymirflow's ledger says.
//
// POST /v1/complete with {"model": "..."} answers {"model", "tokens_in", "tokens_out",
// "cost_usd"} after Options.Delay; FailNext makes the next calls answer 429 with a
// Retry-After; Log lists every call with its time (and the "agent" the body names, when
// it does). It imports the standard library only.
package fakellm

import (
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Options of a Server.
type Options struct {
	CostUSD   float64       // per call; default 0.10
	TokensIn  int64         // per call; default 1000
	TokensOut int64         // per call; default 200
	Delay     time.Duration // how long a call takes; default 0
}

// Server is the fake endpoint.
type Server struct {
	opts Options
	srv  *http.Server
	ln   net.Listener

	mu        sync.Mutex
	calls     int64
	spent     float64
	fail      int
	failAfter string
	inFlight  map[string]int
	log       []Call
}

// Call is one request the server answered, in the order they came.
type Call struct {
	At     time.Time
	Model  string
	Agent  string // the request's "agent", when the caller names itself
	Status int    // 200, or 429
}

// Answer is a call's reply.
type Answer struct {
	Model     string  `json:"model"`
	TokensIn  int64   `json:"tokens_in"`
	TokensOut int64   `json:"tokens_out"`
	CostUSD   float64 `json:"cost_usd"`
}

// New returns a server (not listening yet).
func New(o Options) *Server {
	if o.CostUSD == 0 {
		o.CostUSD = 0.10
	}
	if o.TokensIn == 0 {
		o.TokensIn = 1000
	}
	if o.TokensOut == 0 {
		o.TokensOut = 200
	}
	return &Server{opts: o, inFlight: map[string]int{}}
}

// Start listens on a free loopback port and returns the base URL.
func (s *Server) Start() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	s.ln = ln
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), nil
}

// Close stops the server.
func (s *Server) Close() {
	if s.srv != nil {
		_ = s.srv.Close()
	}
}

// FailNext makes the next n calls answer 429 with Retry-After retryAfter (seconds).
func (s *Server) FailNext(n int, retryAfter int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail, s.failAfter = n, strconv.Itoa(retryAfter)
}

// Spent is what the calls cost so far: each call is charged when it starts, as a
// provider bills a request whose answer the caller never read.
func (s *Server) Spent() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.spent
}

// Calls is the number of calls charged.
func (s *Server) Calls() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// Log is every call answered so far, 429s included, oldest first.
func (s *Server) Log() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.log...)
}

// InFlight is the number of calls for model started and not answered yet.
func (s *Server) InFlight(model string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inFlight[model]
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/complete" {
		http.Error(w, "POST /v1/complete", http.StatusNotFound)
		return
	}
	var req struct {
		Model string `json:"model"`
		Agent string `json:"agent"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil || req.Model == "" {
		http.Error(w, `want {"model": "..."}`, http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	call := Call{At: time.Now(), Model: req.Model, Agent: req.Agent, Status: http.StatusOK}
	if s.fail > 0 {
		s.fail--
		after := s.failAfter
		call.Status = http.StatusTooManyRequests
		s.log = append(s.log, call)
		s.mu.Unlock()
		w.Header().Set("Retry-After", after)
		http.Error(w, "rate limited", http.StatusTooManyRequests)
		return
	}
	s.log = append(s.log, call)
	s.calls++
	s.spent += s.opts.CostUSD
	s.inFlight[req.Model]++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inFlight[req.Model]--
		s.mu.Unlock()
	}()
	select {
	case <-time.After(s.opts.Delay):
	case <-r.Context().Done():
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(Answer{Model: req.Model, TokensIn: s.opts.TokensIn, TokensOut: s.opts.TokensOut, CostUSD: s.opts.CostUSD})
}
