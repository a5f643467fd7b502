package lease_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// The lease as a plain fenced lock, without Watermill: take it, do the work under its
// Context (cancelled if the lease is lost), make the writes that must not outlive it
// with its Fence and through Lease.XAdd (refused once the lease is gone), release it.
func Example() {
	opts, _ := redis.ParseURL(redistest.URL())
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	ns := redistest.Namespace() // keeps the example's keys apart; omit in real use
	defer redistest.DeleteNamespace(context.Background(), rdb, ns)

	locker, err := lease.New(rdb, lease.Options{Scope: ns, TTL: 30 * time.Second})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	le, err := locker.Acquire(ctx, "report", "RHEL-7", lease.AcquireOptions{})
	if err != nil {
		panic(err)
	}
	work := le.Context()
	if _, err := le.XAdd(work, ns+"reports", 0, map[string]any{"issue": le.Issue(), "fence": le.Fence()}); err != nil {
		panic(err)
	}
	fmt.Println("wrote under fence", le.Fence())

	released, err := le.Release(ctx)
	fmt.Println("released:", released, err)
	fmt.Println("work context:", context.Cause(work))

	again, err := locker.Acquire(ctx, "report", "RHEL-7", lease.AcquireOptions{})
	if err != nil {
		panic(err)
	}
	defer again.Release(ctx)
	fmt.Println("next holder's fence:", again.Fence())
	// Output:
	// wrote under fence 1
	// released: true <nil>
	// work context: lease released
	// next holder's fence: 2
}

func ExampleLocker_Acquire() {
	opts, _ := redis.ParseURL(redistest.URL())
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	ns := redistest.Namespace() // keeps the example's keys apart; omit in real use
	defer redistest.DeleteNamespace(context.Background(), rdb, ns)

	locker, err := lease.New(rdb, lease.Options{Scope: ns, Owner: "worker-1"})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	le, err := locker.Acquire(ctx, "triage", " rhel-123 ", lease.AcquireOptions{})
	if err != nil {
		panic(err)
	}
	fmt.Println("held:", le.Issue(), "fence", le.Fence())

	// A second worker is told who holds it.
	_, err = locker.Acquire(ctx, "triage", "RHEL-123", lease.AcquireOptions{Owner: "worker-2"})
	var locked *lease.LockedError
	if errors.As(err, &locked) {
		fmt.Println("busy: held by", locked.Holder.Owner)
	}

	// Do the work with le.Context(): it is cancelled if the lease is lost.
	_ = le.Context()
	released, _ := le.Release(ctx)
	fmt.Println("released:", released)
	// Output:
	// held: RHEL-123 fence 1
	// busy: held by worker-1
	// released: true
}
