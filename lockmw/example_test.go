package lockmw_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
)

func ExampleLocker_Acquire() {
	opts, _ := redis.ParseURL(redistest.URL())
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	ns := redistest.Namespace() // keeps the example's keys apart; omit in real use
	defer redistest.DeleteNamespace(context.Background(), rdb, ns)

	locker, err := lockmw.New(rdb, lockmw.Options{Scope: ns, Owner: "worker-1"})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	lease, err := locker.Acquire(ctx, "triage", " rhel-123 ", lockmw.AcquireOptions{})
	if err != nil {
		panic(err)
	}
	fmt.Println("held:", lease.Issue(), "fence", lease.Fence())

	// A second worker is told who holds it.
	_, err = locker.Acquire(ctx, "triage", "RHEL-123", lockmw.AcquireOptions{Owner: "worker-2"})
	var locked *lockmw.LockedError
	if errors.As(err, &locked) {
		fmt.Println("busy: held by", locked.Holder.Owner)
	}

	// Do the work with lease.Context(): it is cancelled if the lease is lost.
	_ = lease.Context()
	released, _ := lease.Release(ctx)
	fmt.Println("released:", released)
	// Output:
	// held: RHEL-123 fence 1
	// busy: held by worker-1
	// released: true
}
