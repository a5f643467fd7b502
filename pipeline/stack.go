package pipeline

// growStackFrame is growStack's frame: big enough that the runtime gives the goroutine
// an 8 KiB stack in one step (it doubles the stack until the frame fits), which is
// what one event's path through the middlewares and the lease's round trip (go-redis)
// needs.
const growStackFrame = 5 << 10

// growStack grows the calling goroutine's stack while it is still shallow. Watermill
// runs each message on a new goroutine, which starts with a 2 KiB stack; grown on
// demand, it is copied twice (to 4 and then 8 KiB), each time with the frames of the
// middlewares and of go-redis on it, and copying a stack costs a lookup of every
// frame's pointer map: more CPU than the event's own Go code. Grown here, with only
// Watermill's frames below, it is copied once with a few frames (CockroachDB's
// growstack package does the same for its deep request paths).
//
// The caller passes 0; reading buf at an index the compiler cannot know (the function is
// not inlined) keeps the frame from being optimised away.
//
//go:noinline
func growStack(i int) byte {
	var buf [growStackFrame]byte
	return buf[i%len(buf)]
}
