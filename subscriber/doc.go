// Package subscriber is ymirflow's Watermill message.Subscriber on Redis Streams: it
// owns the read loop that watermill-redisstream's subscriber used to run, so nothing
// bends another library's commands from outside (docs/architecture.md, "The read
// path").
//
// One Subscribe is one consumer of one consumer group reading one stream. The loop,
// one entry in flight at a time:
//
//  1. Take the next entry this subscriber read ahead, if any, in read order.
//  2. Else, when a claim pass is due (every ClaimInterval, and at once on start), list
//     the entries idle longer than MaxIdleTime (XPENDING IDLE), ask Config.ShouldClaim
//     about each (the pipeline's lease-aware veto) and XCLAIM those it allows, in one
//     command.
//  3. Else read: XREADGROUP COUNT ReadBatch (1 while Config.BatchNow says no). The
//     acks queued since the last read ride in the same round trip.
//  4. Stamp each entry read with its id, its stream and the read time (event.FieldEntryID,
//     FieldEntryStream, FieldReadAt), unmarshal it (event.Marshaller by default: the
//     readable form and watermill-redisstream's msgpack form), hand it over, and wait for
//     its Ack or Nack. A Nack hands it over again after NackResendSleep, unless its
//     entry is no longer pending for this consumer by then (acked, or claimed by
//     another, through another copy of the entry): that copy is the live one.
//
// An acked message's XACK is queued and sent with the next read, or after AckDelay,
// whichever comes first, several at once; Settle says an entry's XACK was already sent
// by whoever ended the event (the lock middleware's release), and the subscriber then
// sends none. Observer hears of each step, so a caller keeps its own view of what was
// read ahead (the lease taken ahead, the supersede policy) without a hook on the
// client. HandBack gives the entries read ahead back to the group.
//
// A read of new entries or a claim pass's XCLAIM whose reply is lost (the connection
// cut after Redis delivered) is never sent again by go-redis: it fails, and before it
// reads again the loop takes what it delivered to this consumer (XPENDING, then XCLAIM
// with the delivery count kept), so those entries are not this consumer's unseen until
// MaxIdleTime; a loop that ends first takes them and gives them back.
//
// Close stops handing messages over, gives the entries read ahead back to the group
// (any consumer's next claim pass takes them, not only after MaxIdleTime) and sends the
// queued acks without waiting for a blocking read in flight (it ends within BlockTime,
// or at once when the client is closed, and what it read is given back then); the
// client stays open: the caller owns it.
package subscriber
