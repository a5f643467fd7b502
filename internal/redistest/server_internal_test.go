package redistest

import (
	"net"
	"strconv"
	"testing"
)

// TestServerFirstStartMovesOffATakenPort: a port taken between FreePort and the
// server's bind makes redis-server exit; the first start then runs it on another port
// (the CI failure "did not answer within 10s" of a cluster node had this cause).
func TestServerFirstStartMovesOffATakenPort(t *testing.T) {
	s := StartServer(t, ServerOptions{})
	s.Stop()
	l, err := net.Listen("tcp", s.Addr()) // the port, taken by someone else
	if err != nil {
		t.Skipf("the port was taken again before the test could: %v", err)
	}
	defer func() { _ = l.Close() }()
	taken := s.port
	s.started = false // as on a first start
	s.Start()
	if s.port == taken || s.args[1] != strconv.Itoa(s.port) || !pong(s.Addr()) {
		t.Fatalf("after a start on taken port %d: port %d, args %q, answers %v", taken, s.port, s.args[:2], pong(s.Addr()))
	}
}
