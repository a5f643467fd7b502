package ratelimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/ratelimit"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// An agent asks for a permit before it calls a named upstream (here "llm", 2 calls a
// minute shared by every process), and tells everyone to pause when the upstream
// answers 429 with Retry-After.
func ExampleLimiter_Permit() {
	ctx := context.Background()
	opts, _ := redis.ParseURL(redistest.URL())
	rdb := redis.NewClient(opts)
	defer func() { _ = rdb.Close() }()
	ns := redistest.Namespace() // keeps the example's keys apart; omit in real use
	defer redistest.DeleteNamespace(ctx, rdb, ns)
	llm := ratelimit.Rate{N: 2, Per: time.Minute, Burst: 2}
	l, err := ratelimit.New(ratelimit.Config{Client: rdb, Prefix: ns + "ratelimit:", Limits: map[string]ratelimit.Rate{"llm": llm}})
	if err != nil {
		fmt.Println(err)
		return
	}
	for i := 1; i <= 3; i++ {
		ok, retryAfter, err := l.Permit(ctx, "llm")
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("call %d: permitted %v, ask again within a minute: %v\n", i, ok, !ok && retryAfter <= time.Minute)
	}
	// The upstream answered 429 with Retry-After: 30: every process pauses.
	if err := l.Throttle(ctx, "llm", 30*time.Second); err != nil {
		fmt.Println(err)
		return
	}
	ok, retryAfter, _ := l.Permit(ctx, "llm")
	fmt.Printf("after the 429: permitted %v, paused for more than 20s: %v\n", ok, retryAfter > 20*time.Second)
	// Output:
	// call 1: permitted true, ask again within a minute: false
	// call 2: permitted true, ask again within a minute: false
	// call 3: permitted false, ask again within a minute: true
	// after the 429: permitted false, paused for more than 20s: true
}
