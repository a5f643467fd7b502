package web_test

import (
	"context"
	"fmt"
	"net/http/httptest"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/web"
)

// A read-only console (no token) over one pipeline: pages for people, /api/v1/ for
// scripts, and every write refused.
func ExampleNew() {
	ctx := context.Background()
	opts, _ := redis.ParseURL(redistest.URL())
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	ns := redistest.Namespace() // keeps the example's keys apart; omit in real use
	defer redistest.DeleteNamespace(ctx, rdb, ns)

	topo := event.Topology{Namespace: ns + "ymir"}
	locker, _ := lease.New(rdb, lease.Options{Scope: topo.LockScope()}) // the workers' scope
	in, _ := inspect.New(inspect.Config{Client: rdb, Topology: topo, Locker: locker})
	srv, err := web.New(web.Config{Inspector: in, Topology: topo})
	if err != nil {
		fmt.Println(err)
		return
	}
	// In a program: httpsrv.New(srv, httpsrv.Limits{}).ListenAndServe() on 127.0.0.1.
	get := httptest.NewRecorder()
	srv.ServeHTTP(get, httptest.NewRequest("GET", "/api/v1/leases", nil))
	fmt.Print(get.Code, " ", get.Body.String())
	post := httptest.NewRecorder()
	srv.ServeHTTP(post, httptest.NewRequest("POST", "/api/v1/dead-letters/purge", nil))
	fmt.Println(post.Code, srv.Writable())
	// Output:
	// 200 {
	//   "leases": []
	// }
	// 403 false
}
