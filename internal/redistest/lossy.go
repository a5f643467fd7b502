package redistest

import (
	"bufio"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// LossyProxy is a TCP proxy in front of a Redis server that loses replies on purpose:
// armed with LoseReply, it lets the next matching command reach the server and run,
// then cuts the client's connection before that command's reply reaches it. To the
// client this is a connection reset after the server did the work, the case go-redis
// answers by sending the command again (MaxRetries). Everything else passes through.
//
// It speaks just enough RESP (2 and 3) to know which reply belongs to which command,
// so replies to earlier commands of the same pipeline are delivered and the cut falls
// exactly on the chosen one.
type LossyProxy struct {
	tb     testing.TB
	ln     net.Listener
	target string

	mu    sync.Mutex
	rules []*lossRule
	conns map[net.Conn]struct{}

	cuts atomic.Int64
}

// Match decides whether a command (its arguments as sent, the name first) is one
// whose reply the proxy loses.
type Match func(args []string) bool

type lossRule struct {
	match Match
	left  int
}

// NewLossyProxy listens on a free loopback port and forwards to target (host:port);
// it is closed when the test ends.
func NewLossyProxy(tb testing.TB, target string) *LossyProxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("redistest: lossy proxy: %v", err)
	}
	p := &LossyProxy{tb: tb, ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go p.accept()
	tb.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port.
func (p *LossyProxy) Addr() string { return p.ln.Addr().String() }

// Client is a client of base's options (its database, its credentials) that talks
// through the proxy, with go-redis's three retries: a lost reply is answered by sending
// the command again, as a worker's client does. It is closed when the test ends.
func (p *LossyProxy) Client(base *redis.Options) *redis.Client {
	opts := *base
	opts.Addr, opts.MaxRetries = p.Addr(), 3
	c := redis.NewClient(&opts)
	p.tb.Cleanup(func() { _ = c.Close() })
	return c
}

// URL is a redis:// URL through the proxy to database db.
func (p *LossyProxy) URL(db int) string { return "redis://" + p.Addr() + "/" + strconv.Itoa(db) }

// LoseReply arms the proxy: the next n commands that match run on the server and
// lose their replies (each cuts its connection).
func (p *LossyProxy) LoseReply(m Match, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rules = append(p.rules, &lossRule{match: m, left: n})
}

// Armed is how many losses the armed rules still hold. A model step that arms one
// when none is left keeps the losses in a row under go-redis's retries, whatever
// the steps in between sent.
func (p *LossyProxy) Armed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, r := range p.rules {
		n += r.left
	}
	return n
}

// Disarm drops the armed rules: a model run that ends with a loss it armed for its own
// keys still to come leaves none for the next run.
func (p *LossyProxy) Disarm() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rules = nil
}

// Cuts is how many replies the proxy has lost so far.
func (p *LossyProxy) Cuts() int64 { return p.cuts.Load() }

// Close stops listening and closes every connection.
func (p *LossyProxy) Close() {
	_ = p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

func (p *LossyProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		go p.serve(c, s)
	}
}

// take reports whether args match an armed rule, and uses one of its losses.
func (p *LossyProxy) take(args []string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, r := range p.rules {
		if r.match(args) {
			r.left--
			if r.left <= 0 {
				p.rules = append(p.rules[:i], p.rules[i+1:]...)
			}
			return true
		}
	}
	return false
}

// serve pumps one connection. The client side parses each command and queues, in
// order, whether its reply is to be lost; the server side reads one reply per queued
// command and forwards it, or cuts both connections at the first lost one.
func (p *LossyProxy) serve(c, s net.Conn) {
	type expect struct{ lose bool }
	queue := make(chan expect, 1024)
	closeBoth := func() {
		_ = c.Close()
		_ = s.Close()
		p.mu.Lock()
		delete(p.conns, c)
		delete(p.conns, s)
		p.mu.Unlock()
	}
	go func() { // client to server
		defer close(queue)
		r := bufio.NewReader(c)
		for {
			raw, args, err := readCommand(r)
			if err != nil {
				_ = s.Close()
				return
			}
			lose := p.take(args)
			queue <- expect{lose: lose}
			if _, err := s.Write(raw); err != nil {
				return
			}
			if lose {
				return // the connection is about to be cut: nothing after this command is sent
			}
		}
	}()
	defer closeBoth()
	r := bufio.NewReader(s)
	for e := range queue {
		raw, err := readReply(r, nil)
		if err != nil {
			return
		}
		if e.lose {
			p.cuts.Add(1)
			return // the command ran; its reply never reaches the client
		}
		if _, err := c.Write(raw); err != nil {
			return
		}
	}
}

// readCommand reads one command as a client sends it: an array of bulk strings (the
// inline form is not used by go-redis). It returns the raw bytes and the arguments.
func readCommand(r *bufio.Reader) ([]byte, []string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, nil, err
	}
	if !strings.HasPrefix(line, "*") {
		return nil, nil, fmt.Errorf("redistest: lossy proxy: unexpected command line %q", line)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil {
		return nil, nil, err
	}
	raw := []byte(line)
	args := make([]string, 0, n)
	for range n {
		hdr, err := r.ReadString('\n')
		if err != nil {
			return nil, nil, err
		}
		size, err := strconv.Atoi(strings.TrimSpace(hdr[1:]))
		if err != nil || !strings.HasPrefix(hdr, "$") {
			return nil, nil, fmt.Errorf("redistest: lossy proxy: unexpected argument header %q", hdr)
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, nil, err
		}
		raw = append(append(raw, hdr...), buf...)
		args = append(args, string(buf[:size]))
	}
	return raw, args, nil
}

// readReply reads one reply (RESP2 or RESP3), appending its bytes to raw. An attribute
// is read together with the reply it annotates; a push is not a reply (go-redis asks
// for none on these connections) and is an error here.
func readReply(r *bufio.Reader, raw []byte) ([]byte, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return raw, err
	}
	raw = append(raw, line...)
	if len(line) < 3 {
		return raw, fmt.Errorf("redistest: lossy proxy: short reply line %q", line)
	}
	n := func() int { v, _ := strconv.Atoi(strings.TrimSpace(line[1:])); return v }
	switch line[0] {
	case '+', '-', ':', '_', ',', '#', '(':
		return raw, nil
	case '$', '!', '=':
		size := n()
		if size < 0 {
			return raw, nil
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return raw, err
		}
		return append(raw, buf...), nil
	case '*', '~':
		for range max(n(), 0) {
			if raw, err = readReply(r, raw); err != nil {
				return raw, err
			}
		}
		return raw, nil
	case '%':
		for range 2 * max(n(), 0) {
			if raw, err = readReply(r, raw); err != nil {
				return raw, err
			}
		}
		return raw, nil
	case '|':
		for range 2 * max(n(), 0) {
			if raw, err = readReply(r, raw); err != nil {
				return raw, err
			}
		}
		return readReply(r, raw)
	}
	return raw, errors.New("redistest: lossy proxy: unknown reply type " + strconv.Quote(line[:1]))
}

// Command matches a command by name (any case) whose arguments include each of
// contains as a substring of some argument.
func Command(name string, contains ...string) Match {
	return func(args []string) bool {
		if len(args) == 0 || !strings.EqualFold(args[0], name) {
			return false
		}
	next:
		for _, want := range contains {
			for _, a := range args[1:] {
				if strings.Contains(a, want) {
					continue next
				}
			}
			return false
		}
		return true
	}
}

// Script matches the EVALSHA (by its digest) or EVAL (by its source) of the Lua
// script src whose arguments include each of contains.
func Script(src string, contains ...string) Match {
	sum := sha1.Sum([]byte(src))
	sha := hex.EncodeToString(sum[:])
	withArgs := Command("evalsha", contains...)
	withSrc := Command("eval", contains...)
	return func(args []string) bool {
		if len(args) < 2 {
			return false
		}
		switch {
		case strings.EqualFold(args[0], "evalsha"):
			return args[1] == sha && withArgs(args)
		case strings.EqualFold(args[0], "eval"):
			return args[1] == src && withSrc(args)
		}
		return false
	}
}

// Arg matches any command one of whose arguments (the name aside) contains each of
// contains: whatever command carries a record, by a word of the record.
func Arg(contains ...string) Match {
	return func(args []string) bool {
		if len(args) == 0 {
			return false
		}
		return Command(args[0], contains...)(args)
	}
}

// Any matches a command that one of ms matches.
func Any(ms ...Match) Match {
	return func(args []string) bool {
		for _, m := range ms {
			if m(args) {
				return true
			}
		}
		return false
	}
}
